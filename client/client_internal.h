/* client_internal.h: what libtport's files share. */
#ifndef TPORT_CLIENT_INTERNAL_H
#define TPORT_CLIENT_INTERNAL_H

#include <nng/nng.h>
#include <pthread.h>

#include "frame.h"
#include "tport.h"

#define CLIENT_MAX_WINDOW 64

struct tport_client {
  nng_socket sock;
  int timeout_ms;
  size_t chunk_bytes; /* the server's */
  int window;
  bool keep;
  bool verify; /* CRC32C on every chunk (tport_connect_options.verify) */
  /* requests in flight across all threads stay within the server's
   * max_outstanding (it drops a connection that goes past it) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int credits;
  nng_pipe reply_pipe; /* the connection the latest reply came on (the Hello's
                          challenge binds to it) */
};

/* A request in flight on its own context. */
typedef struct client_slot {
  nng_ctx ctx;
  nng_aio *aio;
  nng_msg *reply;
  size_t offset, len; /* the chunk it carries */
  enum { SLOT_IDLE, SLOT_SENDING, SLOT_RECEIVING } phase;
} client_slot;

/* A reply's raw payload; msg owns the bytes (nng_msg_free it). */
typedef struct client_payload {
  const uint8_t *data;
  size_t len;
  nng_msg *msg;
} client_payload;

int client_pack(uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n,
                nng_msg **out, tport_err *err);
int client_unpack(uint16_t method, nng_msg *m, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out, client_payload *payload, tport_err *err);
int client_rpc(tport_client *c, uint16_t method, const ProtobufCMessage *q, const void *payload,
               size_t n, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
               client_payload *reply_payload, tport_err *err);
/* Takes k request credits, all at once (so that threads that each need
 * several never deadlock), waiting up to the client's timeout. */
int client_credits_take(tport_client *c, int k, tport_err *err);
void client_credits_give(tport_client *c, int k);
int client_slot_open(tport_client *c, client_slot *s, tport_err *err);
void client_slot_close(client_slot *s);
void client_slot_send(client_slot *s, nng_msg *m);
int client_slot_finish(client_slot *s, tport_err *err);
void client_ref_to_wire(const tport_ref *ref, Tport__Ref *w);
void client_info_from_wire(const Tport__TensorInfo *w, tport_tensor_info *out);

#endif
