/* service_util.h: servers for the service tests: in-process (inproc) and
 * tportd in a child process (tcp, ipc). */
#ifndef TPORT_SERVICE_UTIL_H
#define TPORT_SERVICE_UTIL_H

#include <nng/nng.h>
#include <sys/types.h>

#include "frame.h"

#include "server.h"
#include "tport.h"

/* The operator tenant of the tests' servers (--admin). */
#define SVC_OPERATOR "ops"

/* The tests' defaults (cpu,sim:2, 64 KiB chunks, operator SVC_OPERATOR, the
 * local secret on as tportd's default has it), to adjust before
 * svc_start_with, which starts it in this process on a fresh inproc:// URL
 * (and frees the config). */
void svc_config(server_config *cfg);
/* svc_config with a shm socket at DIR/shm.sock, DIR being
 * /tmp/tport-TAG-PID (written into dir): rmdir it after server_stop. */
void svc_config_shm(server_config *cfg, const char *tag, char *dir, size_t dirlen);
server *svc_start_with(server_config *cfg, char *url, size_t len);
/* A server in this process listening on a fresh loopback tcp:// URL and a
 * fresh ipc:// one (written into tcp and ipc), its config made by
 * configure (from svc_config or svc_config_shm) for each try: a port
 * another test took is tried again elsewhere, up to 20 times.  NULL: none
 * could listen. */
server *svc_start_tcp_ipc(void (*configure)(server_config *), char *tcp, size_t tcplen, char *ipc,
                          size_t ipclen);
/* An in-process server on a fresh inproc:// URL with cpu and sim:2. */
server *svc_start_inproc(char *url, size_t len, const char *extra_devices);
/* tportd in a child process listening on url; waits until it answers.
 * Returns -1 when it could not start there (the port taken): pick another. */
pid_t svc_spawn(const char *url, const char *const *extra_args);
/* The same for a tls+tcp:// URL: ready when its port takes a connection. */
pid_t svc_spawn_tls(const char *url, const char *const *extra, const char *ca);
/* SIGTERM, then wait; returns the exit status (or -1). */
int svc_terminate(pid_t pid);
/* A fresh tcp URL on loopback and a fresh ipc URL under /tmp. */
void svc_tcp_url(char *url, size_t len);
void svc_ipc_url(char *url, size_t len);
/* Connects or fails the test. */
tport_client *svc_connect(const char *url, const char *tenant);
/* The status code of a raw reply message (its Status is field 1 whatever
 * its type d), with the message into msg (256 bytes) when not NULL.  With
 * out, the unpacked reply is handed over (free it with
 * protobuf_c_message_free_unpacked); m stays the caller's. */
int svc_reply_status(nng_msg *m, const ProtobufCMessageDescriptor *d, char *msg,
                     ProtobufCMessage **out);
/* The answer to a Hello challenge for tenant with this user's local secret
 * (transport/local_secret.h), as libtport gives it on a connection without
 * TLS: pipe is the one the challenge came on (bound to its address on tcp). */
void svc_local_answer(nng_pipe pipe, const uint8_t *challenge, const char *tenant,
                      uint8_t *answer);
/* The same for a connection to the server's address sa (NULL: unbound). */
void svc_local_answer_sa(const nng_sockaddr *sa, const uint8_t *challenge, const char *tenant,
                         uint8_t *answer);
/* Hello as tenant on a raw REQ socket (no contexts in use), answering a
 * challenge for the local secret as libtport does; the final status code,
 * with its message into msg (256 bytes) when not NULL. */
int svc_hello(nng_socket s, const char *tenant, char *msg);
/* A counter from tport_stats (-1 when absent). */
int64_t svc_counter(tport_client *c, const char *name);
/* A server-wide counter of the server at url, asked as SVC_OPERATOR (Stats
 * shows them to the operator only). */
int64_t svc_server_counter(const char *url, const char *name);
/* A process's resident memory in KiB (/proc/PID/status VmRSS; -1: none). */
long svc_rss_kb(pid_t pid);
/* pid's minor page faults so far (/proc/PID/stat); -1 when unreadable. */
long svc_minor_faults(pid_t pid);

/* SVC_UNDER_SANITIZER: this build (and so its tportd) runs under ASan or
 * TSan, whose allocators are not glibc's (no body cache, a quarantine). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SVC_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SVC_UNDER_SANITIZER 1
#endif
#endif

#endif
