/*
 * hostile_util.h: what the hostile-client suites (test_hostile_wire.c,
 * test_hostile_conn.c, test_hostile_quota.c) share.
 *
 * Most requests go as raw frames over nng REQ sockets with several contexts
 * (to race requests of one connection against each other); the slow-reader
 * tests speak nng's SP/TCP framing by hand on a plain TCP socket, because no
 * nng socket can be told to stop reading.  Everything runs on loopback,
 * every wait is bounded (10 s per reply, a few seconds for polls), and no
 * assertion is about speed: a limit only turns "never" into a failure.  A
 * helper that cannot do its part fails the test (cr_assert).
 */
#ifndef TPORT_HOSTILE_UTIL_H
#define TPORT_HOSTILE_UTIL_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stdint.h>

#include "frame.h"
#include "service_util.h"

#define OPERATOR "ops"   /* the --admin tenant of these tests' servers */
#define CHUNK (64 << 10) /* svc_config's chunk size */
#define REPLY_MS 10000   /* the longest any reply may take */
#define RAW_CTXS 8

int64_t now_ms(void);
void fill(uint8_t *p, size_t n, unsigned seed);

/* ---------------------------------------------------------------- servers */

/* svc_config plus the operator tenant (svc_config may already name it). */
void config(server_config *cfg);
server *start(server_config *cfg, char *url, size_t len);
server *start_default(char *url, size_t len);
/* An in-process server listening on inproc and on a loopback tcp port (the
 * slow-reader tests need a real socket); frees cfg. */
server *start_tcp(server_config *cfg, char *inproc, size_t ilen, char *tcp, size_t tlen);
tport_client *connect_as(const char *url, const char *tenant, int timeout_ms);
/* An operator's counter (-1 when the server has none of that name). */
int64_t op_counter(const char *url, const char *name);
/* Polls an operator counter until it is `want`, for up to limit_ms; returns
 * the last value read. */
int64_t op_counter_until(const char *url, const char *name, int64_t want, int limit_ms);
/* Puts and gets back n fresh bytes: the server still serves a normal client. */
void round_trip(tport_client *c, size_t n, unsigned seed, const char *when);

/* ---------------------------------------------------------------- raw REQ connections */

/* A raw REQ connection with RAW_CTXS contexts: requests of one connection in
 * flight at once. */
typedef struct rawc {
  nng_socket sock;
  nng_ctx ctx[RAW_CTXS];
  nng_aio *aio[RAW_CTXS];
  uint16_t method[RAW_CTXS];
  bool hello; /* a Hello went out: the first other request says Hello as "default" first */
} rawc;

void raw_open(rawc *r, const char *url);
void raw_close(rawc *r);
const char *method_name(uint16_t method);
void raw_send(rawc *r, int i, uint16_t method, const ProtobufCMessage *q, const void *payload,
              size_t n);
/* Waits for context i's request to have gone out. */
void raw_sent(rawc *r, int i);
/* The reply on context i: its status code, message (msg: 256 bytes),
 * optionally the unpacked reply and the message itself (for its payload). */
int raw_wait(rawc *r, int i, const ProtobufCMessageDescriptor *d, char *msg, ProtobufCMessage **out,
             nng_msg **keep);
int raw_call(rawc *r, uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n,
             const ProtobufCMessageDescriptor *d, char *msg, ProtobufCMessage **out,
             nng_msg **keep);
Tport__Ref mkref(const uint8_t *handle, size_t len, const char *name);
/* Hello as tenant, answering a challenge for the local secret as libtport
 * does (the tests' servers have it on, as tportd by default). */
int raw_hello(rawc *r, const char *tenant, char *msg);
/* PutBegin of a uint8 tensor of nbytes (no commit), converted to dtype at
 * its commit unless dtype is -1. */
int raw_put_begin_as(rawc *r, size_t nbytes, const char *device, const char *name, int dtype,
                     uint8_t handle[16], char *msg);
int raw_put_begin(rawc *r, size_t nbytes, const char *device, const char *name, uint8_t handle[16],
                  char *msg);
/* PutBegin of a uint8 tensor of nbytes named name with replace: it takes
 * the name at its commit. */
int raw_put_begin_replacing(rawc *r, size_t nbytes, const char *name, uint8_t handle[16],
                            char *msg);
void chunk_req(Tport__PutChunkRequest *q, Tport__Ref *ref, uint64_t offset);
int raw_chunk(rawc *r, const uint8_t handle[16], uint64_t offset, const void *p, size_t n,
              char *msg);
/* PutCommit; with info, the stored tensor's storage bytes. */
int raw_commit(rawc *r, const uint8_t handle[16], char *msg, int64_t *storage_nbytes);
/* Sends chunks [first, end) of data (nbytes in all) one by one, each OK. */
void raw_chunks(rawc *r, const uint8_t handle[16], const uint8_t *data, size_t nbytes, size_t first,
                size_t end);
size_t nchunks(size_t nbytes);
/* A whole upload of data as a uint8 tensor, every step OK. */
void raw_put(rawc *r, const uint8_t *data, size_t nbytes, const char *device, const char *name,
             uint8_t handle[16]);
void get_begin_req(Tport__GetBeginRequest *q, Tport__Ref *ref, uint64_t inline_max);
/* GetBegin; the transfer id (when one came) into transfer. */
int raw_get_begin(rawc *r, const Tport__Ref *ref, uint64_t inline_max, char *msg,
                  uint8_t transfer[16]);
/* The tensor's bytes, inline or through GetChunk (a server may send only
 * small tensors inline): exact, or the test fails. */
void raw_expect_bytes(rawc *r, const uint8_t handle[16], const uint8_t *want, size_t n,
                      const char *when);
int raw_get_chunk(rawc *r, const uint8_t *transfer, size_t tlen, uint64_t offset, uint64_t length,
                  const void *payload, size_t n, char *msg);

/* ---------------------------------------------------------------- SP over TCP by hand */

/* A TCP connection that speaks nng's SP framing itself: a REQ peer that can
 * stop reading.  rcvbuf: its receive buffer (small: the server's replies
 * back up at once).  It has said Hello as "default" (answering a challenge
 * for the local secret, as libtport does) and read the reply. */
int sp_connect(const char *tcp_url, int rcvbuf);
/* The same as the tenant named. */
int sp_connect_as(const char *tcp_url, int rcvbuf, const char *tenant);
/* The same without the Hello: a connection that has proved nothing. */
int sp_connect_raw(const char *tcp_url, int rcvbuf);
/* One reply's frame (after its request id), as a message to free. */
nng_msg *sp_recv(int fd);
/* One request: u64 length, u32 request id (top bit set), the frame.  False
 * when the connection is gone. */
bool sp_send(int fd, uint32_t id, uint16_t method, const ProtobufCMessage *q);
/* The peer has closed (FIN or RST seen). */
bool sp_peer_closed(int fd);
/* Reads and discards until EOF or a reset (true), or until quiet_ms pass
 * without a byte while the connection stays open (false). */
bool sp_drain(int fd, int quiet_ms, size_t *bytes);
void sp_get_begin(Tport__GetBeginRequest *q, Tport__Ref *ref, const char *name);
/* Reads one reply: its request id into *id, its status code (msg: 256
 * bytes), optionally the unpacked reply (descriptor d).  The test fails
 * when none comes within REPLY_MS. */
int sp_recv_reply(int fd, uint32_t *id, const ProtobufCMessageDescriptor *d, char *msg,
            ProtobufCMessage **out);

#endif
