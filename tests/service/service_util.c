/* service_util.c: see service_util.h. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "service_util.h"
#include "hello_mac.h"
#include "local_secret.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int seq;

void svc_config_shm(server_config *cfg, const char *tag, char *dir, size_t dirlen)
{
  svc_config(cfg);
  snprintf(dir, dirlen, "/tmp/tport-%s-%d", tag, (int)getpid());
  char path[128];
  snprintf(path, sizeof path, "%s/shm.sock", dir);
  cfg->shm_socket = strdup(path);
  cfg->shm_socket_set = true;
}

void svc_config(server_config *cfg)
{
  config_defaults(cfg);
  cfg->devices = strdup("cpu,sim:2");
  cfg->chunk_bytes = 64 << 10; /* small chunks: many in flight even for small tensors */
  cfg->log_level = 1;
  cfg->workers = 4;
  cfg->admin = strdup(SVC_OPERATOR); /* sees server-wide Stats */
  /* as tportd by default: clients prove this user's local secret */
  char path[LOCAL_SECRET_PATH_MAX];
  bool off = false;
  cr_assert_eq(transport_local_secret_default(path, sizeof path, &off, NULL), 0);
  cfg->local_secret = off ? NULL : strdup(path);
}

void svc_local_answer(nng_pipe pipe, const uint8_t *challenge, const char *tenant,
                      uint8_t *answer)
{
  nng_sockaddr sa;
  bool known = nng_pipe_get_addr(pipe, NNG_OPT_REMADDR, &sa) == 0;
  svc_local_answer_sa(known ? &sa : NULL, challenge, tenant, answer);
}

void svc_local_answer_sa(const nng_sockaddr *sa, const uint8_t *challenge, const char *tenant,
                         uint8_t *answer)
{
  char path[LOCAL_SECRET_PATH_MAX];
  bool off = false;
  tport_err err;
  cr_assert_eq(transport_local_secret_default(path, sizeof path, &off, &err), 0, "%s", err.msg);
  uint8_t secret[HELLO_SECRET_MAX_BYTES];
  size_t len;
  cr_assert_eq(transport_local_secret_read(path, secret, &len, &err), 0, "%s", err.msg);
  uint8_t binding[HELLO_BINDING_BYTES];
  bool bound = false;
  if (sa)
    cr_assert_eq(transport_local_binding_addr(sa, binding, &bound, &err), 0, "%s", err.msg);
  cr_assert_eq(transport_hello_mac(secret, len, challenge, tenant, bound ? binding : NULL, answer,
                                   &err),
               0, "%s", err.msg);
}

/* One Hello on a raw socket: its status, the reply kept in *out. */
static int hello_once(nng_socket s, const char *tenant, const uint8_t *answer, char *msg,
                      Tport__HelloReply **out, nng_pipe *pipe)
{
  Tport__HelloRequest q = TPORT__HELLO_REQUEST__INIT;
  q.protocol_version = 1;
  q.client = "service_util";
  q.tenant = (char *)tenant;
  if (answer) {
    q.auth_response.data = (uint8_t *)answer;
    q.auth_response.len = HELLO_MAC_BYTES;
  }
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, frame_head_size(&q.base)), 0);
  frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_HELLO, 0, &q.base);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
  cr_assert_eq(nng_recvmsg(s, &m, 0), 0, "the server must answer a Hello");
  *pipe = nng_msg_get_pipe(m);
  int code = svc_reply_status(m, &tport__hello_reply__descriptor, msg, (ProtobufCMessage **)out);
  nng_msg_free(m);
  return code;
}

int svc_hello(nng_socket s, const char *tenant, char *msg)
{
  char tmp[256];
  Tport__HelloReply *r = NULL;
  nng_pipe pipe;
  int code = hello_once(s, tenant, NULL, msg ? msg : tmp, &r, &pipe);
  if (code == TPORT_UNAUTHENTICATED && r->local_secret &&
      r->auth_challenge.len == HELLO_CHALLENGE_BYTES) {
    uint8_t answer[HELLO_MAC_BYTES];
    svc_local_answer(pipe, r->auth_challenge.data, tenant, answer);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    code = hello_once(s, tenant, answer, msg ? msg : tmp, &r, &pipe);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return code;
}

server *svc_start_with(server_config *cfg, char *url, size_t len)
{
  snprintf(url, len, "inproc://tport-test-%d-%d", (int)getpid(), atomic_fetch_add(&seq, 1));
  cfg->listen[0] = strdup(url);
  cfg->nlisten = 1;
  server *s;
  tport_err err;
  cr_assert_eq(server_start(cfg, &s, &err), 0, "%s", err.msg);
  config_free(cfg);
  return s;
}

server *svc_start_tcp_ipc(void (*configure)(server_config *), char *tcp, size_t tcplen, char *ipc,
                          size_t ipclen)
{
  server *s = NULL;
  for (int attempt = 0; attempt < 20 && !s; attempt++) {
    server_config cfg;
    configure(&cfg);
    svc_tcp_url(tcp, tcplen);
    svc_ipc_url(ipc, ipclen);
    cfg.listen[0] = strdup(tcp);
    cfg.listen[1] = strdup(ipc);
    cfg.nlisten = 2;
    tport_err err;
    if (server_start(&cfg, &s, &err) != 0)
      s = NULL; /* the port was taken: another */
    config_free(&cfg);
  }
  return s;
}

server *svc_start_inproc(char *url, size_t len, const char *devices)
{
  server_config cfg;
  svc_config(&cfg);
  if (devices) {
    free(cfg.devices);
    cfg.devices = strdup(devices);
  }
  return svc_start_with(&cfg, url, len);
}

void svc_tcp_url(char *url, size_t len)
{
  static unsigned seed;
  if (!seed)
    seed = (unsigned)time(NULL) ^ (unsigned)getpid() << 8;
  snprintf(url, len, "tcp://127.0.0.1:%d", 20000 + (int)(rand_r(&seed) % 30000));
}

void svc_ipc_url(char *url, size_t len)
{
  snprintf(url, len, "ipc:///tmp/tport-test-%d-%d.sock", (int)getpid(), atomic_fetch_add(&seq, 1));
}

static pid_t spawn_tportd(const char *url, const char *const *extra)
{
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that failed */
    /* a pack run elsewhere (bench/gpu-check) names its own copy */
    const char *exe = getenv("TPORT_TEST_TPORTD");
    if (!exe || !*exe)
      exe = TPORTD_PATH;
    const char *argv[32] = {exe,           "--listen", url,       "--devices", "cpu,sim:2",
                            "--log-level", "1",        "--chunk", "65536",
                            "--admin",     SVC_OPERATOR};
    int n = 11;
    for (int i = 0; extra && extra[i] && n < 30; i++)
      argv[n++] = extra[i];
    argv[n] = NULL;
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

pid_t svc_spawn(const char *url, const char *const *extra)
{
  pid_t pid = spawn_tportd(url, extra);
  for (int i = 0; i < 200; i++) {
    tport_client *c = NULL;
    int rc = tport_connect(url, &(tport_connect_options){.timeout_ms = 2000}, &c, NULL);
    if (rc == 0 || rc == TPORT_UNAUTHENTICATED) { /* it answers (asking for a proof, maybe) */
      tport_close(c);
      return pid;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
      return -1; /* it exited: the address was taken, say */
    usleep(25000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

int svc_terminate(pid_t pid)
{
  kill(pid, SIGTERM);
  int st;
  if (waitpid(pid, &st, 0) != pid)
    return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

tport_client *svc_connect(const char *url, const char *tenant)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = tenant, .timeout_ms = 20000};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  return c;
}

int64_t svc_counter(tport_client *c, const char *name)
{
  tport_counter *v;
  size_t n;
  cr_assert_eq(tport_stats(c, &v, &n, NULL), 0);
  int64_t r = -1;
  for (size_t i = 0; i < n; i++)
    if (strcmp(v[i].name, name) == 0)
      r = v[i].value;
  free(v);
  return r;
}

int64_t svc_server_counter(const char *url, const char *name)
{
  tport_client *ops;
  tport_err err;
  tport_connect_options o = {.tenant = SVC_OPERATOR, .timeout_ms = 20000, .no_shm = true};
  cr_assert_eq(tport_connect(url, &o, &ops, &err), 0, "%s", err.msg);
  int64_t v = svc_counter(ops, name);
  tport_close(ops);
  return v;
}

int svc_reply_status(nng_msg *m, const ProtobufCMessageDescriptor *d, char *msg,
                     ProtobufCMessage **out)
{
  frame_view v;
  cr_assert_eq(frame_parse(nng_msg_body(m), nng_msg_len(m), &v, NULL), 0);
  cr_assert(v.flags & FRAME_FLAG_REPLY);
  ProtobufCMessage *r;
  cr_assert_eq(frame_unpack(&v, d, &r, NULL), 0);
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, "status");
  cr_assert_not_null(f);
  const Tport__Status *st = *(Tport__Status *const *)((const char *)r + f->offset);
  int code = st ? (int)st->code : 0;
  if (msg)
    snprintf(msg, 256, "%s", st && st->message ? st->message : "");
  if (out)
    *out = r;
  else
    protobuf_c_message_free_unpacked(r, NULL);
  return code;
}

pid_t svc_spawn_tls(const char *url, const char *const *extra, const char *ca)
{
  (void)ca;
  /* the listener is up when its port takes a TCP connection (a TLS probe
   * could not pass a server that wants client certificates) */
  const char *hp = strstr(url, "://");
  char host[64] = "127.0.0.1";
  int port = hp ? atoi(strrchr(hp, ':') + 1) : 0;
  pid_t pid = spawn_tportd(url, extra);
  for (int i = 0; i < 200; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    if (ok)
      return pid;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
      return -1;
    usleep(25000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

long svc_minor_faults(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = 0;
  /* after "pid (comm) ": the comm may hold spaces and parentheses, so from
   * its last ')'; then state ppid pgrp session tty_nr tpgid flags minflt */
  const char *p = strrchr(buf, ')');
  long minflt = -1;
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %ld", &minflt) != 1)
    return -1;
  return minflt;
}

long svc_rss_kb(pid_t pid)
{
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
      break;
  if (f)
    fclose(f);
  return kb;
}
