/*
 * test_local_secret.c: without --auth-file, only the user who runs tportd
 * reaches it (transport/local_secret.h).
 *
 * The file and its directory (made private, refused when anyone else could
 * have chosen them, one secret however many servers start at once); a
 * default server that refuses every request of a client that cannot prove
 * the secret -- a client of another uid (a child that setuid()s to nobody and
 * runs the tport CLI), one given another secret file, one with the secret
 * off, raw requests without a Hello -- and serves the same user's client with
 * no set-up; and operator (--admin) tenants that are never taken on a claim.
 */
#define _GNU_SOURCE /* nftw */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "local_secret.h"
#include "service_util.h"

/* The directories a test made, removed after it (the suite's fini). */
static char made[16][64];
static int nmade;

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st, (void)flag, (void)ftw;
  remove(path); /* what is left is left: a test's failure says more */
  return 0;
}

static void remove_made(void)
{
  for (int i = 0; i < nmade; i++)
    nftw(made[i], remove_one, 8, FTW_DEPTH | FTW_PHYS);
}

TestSuite(local_secret, .fini = remove_made);

/* A fresh private directory under /tmp (0700, ours). */
static void fresh_dir(char *buf, size_t len)
{
  snprintf(buf, len, "/tmp/tport-ls-XXXXXX");
  cr_assert_not_null(mkdtemp(buf));
  if (nmade < 16)
    snprintf(made[nmade++], sizeof made[0], "%s", buf);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  cr_assert_geq(fd, 0, "%s: %m", path);
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  fchmod(fd, mode);
  close(fd);
}

static void read_text(const char *path, char *buf, size_t len)
{
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
  fclose(f);
}

Test(local_secret, default_file_and_directory_are_private_and_reused)
{
  char xdg[64], path[LOCAL_SECRET_PATH_MAX], want[128];
  fresh_dir(xdg, sizeof xdg);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  unsetenv(LOCAL_SECRET_ENV);
  bool off = true;
  cr_assert_eq(transport_local_secret_default(path, sizeof path, &off, NULL), 0);
  snprintf(want, sizeof want, "%s/tensorport/local-secret", xdg);
  cr_assert_str_eq(path, want);
  cr_assert(!off);
  uint8_t a[HELLO_SECRET_MAX_BYTES], b[HELLO_SECRET_MAX_BYTES];
  size_t alen = 0, blen = 0;
  tport_err err;
  cr_assert_eq(transport_local_secret_read(path, a, &alen, &err), TPORT_NOT_FOUND, "%s", err.msg);
  cr_assert_eq(transport_local_secret_ensure(path, a, &alen, &err), 0, "%s", err.msg);
  cr_assert_eq(alen, LOCAL_SECRET_BYTES);
  struct stat st;
  cr_assert_eq(lstat(path, &st), 0);
  cr_assert(S_ISREG(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0600, "the file is %03o", st.st_mode & 0777);
  cr_assert_eq(st.st_uid, geteuid());
  snprintf(want, sizeof want, "%s/tensorport", xdg);
  cr_assert_eq(lstat(want, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0700, "the directory is %03o", st.st_mode & 0777);
  /* 64 hex digits and a newline */
  char text[256];
  read_text(path, text, sizeof text);
  cr_assert_eq(strlen(text), 65);
  /* a second start reads the same secret, never a new one */
  cr_assert_eq(transport_local_secret_ensure(path, b, &blen, &err), 0, "%s", err.msg);
  cr_assert(blen == alen && memcmp(a, b, alen) == 0);
  cr_assert_eq(transport_local_secret_read(path, b, &blen, &err), 0, "%s", err.msg);
  cr_assert(blen == alen && memcmp(a, b, alen) == 0);
  /* without XDG_RUNTIME_DIR: /tmp/tensorport-UID; off turns it off */
  unsetenv("XDG_RUNTIME_DIR");
  cr_assert_eq(transport_local_secret_default(path, sizeof path, &off, NULL), 0);
  snprintf(want, sizeof want, "/tmp/tensorport-%u/local-secret", (unsigned)geteuid());
  cr_assert_str_eq(path, want);
  setenv(LOCAL_SECRET_ENV, "off", 1);
  cr_assert_eq(transport_local_secret_default(path, sizeof path, &off, NULL), 0);
  cr_assert(off);
}

/* Whatever another user could have chosen is refused, and left as it is. */
Test(local_secret, refuses_what_another_user_could_have_made)
{
  char dir[64], path[LOCAL_SECRET_PATH_MAX], link_path[LOCAL_SECRET_PATH_MAX], text[256];
  fresh_dir(dir, sizeof dir);
  const char *hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
  uint8_t s[HELLO_SECRET_MAX_BYTES];
  size_t len;
  tport_err err;
  snprintf(path, sizeof path, "%s/secret", dir);
  /* readable by others */
  write_file(path, hex, 0644);
  cr_assert_eq(transport_local_secret_read(path, s, &len, &err), TPORT_PERMISSION_DENIED);
  cr_assert(strstr(err.msg, "mode 644"), "%s", err.msg);
  cr_assert_eq(transport_local_secret_ensure(path, s, &len, &err), TPORT_PERMISSION_DENIED);
  read_text(path, text, sizeof text);
  cr_assert_str_eq(text, hex, "a refused file is never replaced");
  /* a symbolic link, even to a good file */
  chmod(path, 0600);
  cr_assert_eq(transport_local_secret_read(path, s, &len, &err), 0, "%s", err.msg);
  snprintf(link_path, sizeof link_path, "%s/link", dir);
  cr_assert_eq(symlink(path, link_path), 0);
  cr_assert_eq(transport_local_secret_read(link_path, s, &len, &err), TPORT_PERMISSION_DENIED);
  cr_assert(strstr(err.msg, "link"), "%s", err.msg);
  cr_assert_eq(transport_local_secret_ensure(link_path, s, &len, &err), TPORT_PERMISSION_DENIED);
  /* not hex: refused, not rewritten */
  write_file(path, "not a secret\n", 0600);
  cr_assert_eq(transport_local_secret_ensure(path, s, &len, &err), TPORT_INVALID_ARGUMENT);
  read_text(path, text, sizeof text);
  cr_assert_str_eq(text, "not a secret\n");
  /* a fifo does not hang the reader */
  char fifo[LOCAL_SECRET_PATH_MAX];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(transport_local_secret_read(fifo, s, &len, &err), TPORT_PERMISSION_DENIED);
  /* a directory others may write to (no sticky bit) */
  write_file(path, hex, 0600);
  chmod(dir, 0777);
  cr_assert_eq(transport_local_secret_read(path, s, &len, &err), TPORT_PERMISSION_DENIED);
  chmod(dir, 0700);
  if (geteuid() != 0)
    return; /* what follows chowns to nobody */
  struct passwd *nobody = getpwnam("nobody");
  cr_assert_not_null(nobody);
  /* a file of another user's */
  cr_assert_eq(chown(path, nobody->pw_uid, nobody->pw_gid), 0);
  cr_assert_eq(transport_local_secret_read(path, s, &len, &err), TPORT_PERMISSION_DENIED);
  cr_assert(strstr(err.msg, "belongs to uid"), "%s", err.msg);
  cr_assert_eq(transport_local_secret_ensure(path, s, &len, &err), TPORT_PERMISSION_DENIED);
  /* the default directory made by another user (or group-readable) */
  char xdg[64], def[LOCAL_SECRET_PATH_MAX], tdir[LOCAL_SECRET_PATH_MAX];
  fresh_dir(xdg, sizeof xdg);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  unsetenv(LOCAL_SECRET_ENV);
  bool off;
  cr_assert_eq(transport_local_secret_default(def, sizeof def, &off, NULL), 0);
  snprintf(tdir, sizeof tdir, "%s/tensorport", xdg);
  cr_assert_eq(mkdir(tdir, 0700), 0);
  cr_assert_eq(chown(tdir, nobody->pw_uid, nobody->pw_gid), 0);
  cr_assert_eq(transport_local_secret_ensure(def, s, &len, &err), TPORT_PERMISSION_DENIED);
  cr_assert(strstr(err.msg, "must be this user's"), "%s", err.msg);
  cr_assert_eq(chown(tdir, 0, 0), 0);
  chmod(tdir, 0750);
  cr_assert_eq(transport_local_secret_ensure(def, s, &len, &err), TPORT_PERMISSION_DENIED);
  /* the default directory as a link to a private one of ours */
  rmdir(tdir);
  char elsewhere[64];
  fresh_dir(elsewhere, sizeof elsewhere);
  cr_assert_eq(symlink(elsewhere, tdir), 0);
  cr_assert_eq(transport_local_secret_ensure(def, s, &len, &err), TPORT_PERMISSION_DENIED);
  cr_assert(strstr(err.msg, "not a directory"), "%s", err.msg);
}

/* Many servers starting at once make one secret between them, and leave no
 * temporary file behind. */
Test(local_secret, concurrent_starts_make_one_secret)
{
  char dir[64], path[LOCAL_SECRET_PATH_MAX];
  fresh_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/local-secret", dir);
  enum { N = 16 };
  int go[2], out[2];
  cr_assert_eq(pipe(go), 0);
  cr_assert_eq(pipe(out), 0);
  for (int i = 0; i < N; i++) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
      close(go[1]);
      char ch;
      if (read(go[0], &ch, 1) != 0) /* every child starts when the pipe closes */
        _exit(3);
      uint8_t s[HELLO_SECRET_MAX_BYTES];
      size_t len = 0;
      if (transport_local_secret_ensure(path, s, &len, NULL) != 0 || len != LOCAL_SECRET_BYTES)
        _exit(1);
      _exit(write(out[1], s, LOCAL_SECRET_BYTES) == LOCAL_SECRET_BYTES ? 0 : 2);
    }
  }
  close(go[0]);
  close(go[1]);
  close(out[1]);
  uint8_t first[LOCAL_SECRET_BYTES], s[LOCAL_SECRET_BYTES];
  for (int i = 0; i < N; i++) {
    int st;
    cr_assert_gt(wait(&st), 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a start failed (%d)", WEXITSTATUS(st));
  }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(read(out[0], i ? s : first, LOCAL_SECRET_BYTES), LOCAL_SECRET_BYTES);
    if (i)
      cr_assert_eq(memcmp(first, s, LOCAL_SECRET_BYTES), 0, "start %d read another secret", i);
  }
  close(out[0]);
  DIR *d = opendir(dir);
  int files = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    files += e->d_name[0] != '.';
  closedir(d);
  cr_assert_eq(files, 1, "temporary files left beside the secret");
}

Test(local_secret, only_urls_of_this_host)
{
  const char *yes[] = {"ipc:///tmp/x.sock", "inproc://x", "unix:///tmp/x", "abstract://x",
                       "tcp://127.0.0.1:7450", "TCP://127.1.2.3:1", "tcp://[::1]:7450",
                       "tcp://localhost:7450", "tls+tcp://127.0.0.1:1", "ws://127.0.0.1:1/p",
                       "tcp4://127.0.0.1:1", "tcp6://[::1]:1"};
  const char *no[] = {"tcp://127.0.0.1.evil.example:7450", "tcp://127.evil:1", "tcp://10.0.0.1:1",
                      "tcp://example.com:1", "tcp://[::2]:1", "tcp://localhost.evil:1",
                      "zt://127.0.0.1:1", "tcp://[::1", "garbage"};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    cr_assert(transport_local_secret_url_ok(yes[i]), "%s", yes[i]);
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    cr_assert(!transport_local_secret_url_ok(no[i]), "%s", no[i]);
}

/* ---------------------------------------------------------------- servers */

/* A raw connection's request with no Hello, or after one that did not prove. */
static int raw_request(nng_socket s, uint16_t method, const ProtobufCMessage *q,
                       const ProtobufCMessageDescriptor *d, char *msg)
{
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, frame_head_size(q)), 0);
  frame_write_head(nng_msg_body(m), method, 0, q);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
  int rv_ = nng_recvmsg(s, &m, 0);
  cr_assert_eq(rv_, 0, "the server must answer (%s)", nng_strerror(rv_));
  int code = svc_reply_status(m, d, msg, NULL);
  nng_msg_free(m);
  return code;
}

static nng_socket raw_dial(const char *url)
{
  nng_socket s;
  cr_assert_eq(nng_req0_open(&s), 0);
  nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
  nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  cr_assert_eq(nng_dial(s, url, NULL, 0), 0);
  return s;
}

/* Nothing but Hello: Stats, a get by name, a put, a free. */
static void refused_everything(nng_socket s, const char *why)
{
  char msg[256];
  Tport__StatsRequest sq = TPORT__STATS_REQUEST__INIT;
  cr_assert_eq(raw_request(s, TPORT__METHOD__METHOD_STATS, &sq.base, &tport__stats_reply__descriptor,
                           msg),
               TPORT_UNAUTHENTICATED, "%s: Stats: %s", why, msg);
  Tport__Ref ref = TPORT__REF__INIT;
  ref.name = "kept";
  Tport__InfoRequest iq = TPORT__INFO_REQUEST__INIT;
  iq.ref = &ref;
  cr_assert_eq(raw_request(s, TPORT__METHOD__METHOD_INFO, &iq.base, &tport__info_reply__descriptor,
                           msg),
               TPORT_UNAUTHENTICATED, "%s: Info: %s", why, msg);
  Tport__FreeRequest fq = TPORT__FREE_REQUEST__INIT;
  fq.ref = &ref;
  cr_assert_eq(raw_request(s, TPORT__METHOD__METHOD_FREE, &fq.base, &tport__free_reply__descriptor,
                           msg),
               TPORT_UNAUTHENTICATED, "%s: Free: %s", why, msg);
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz = 4;
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = &sz;
  Tport__PutBeginRequest pq = TPORT__PUT_BEGIN_REQUEST__INIT;
  pq.desc = &d;
  pq.name = "kept";
  cr_assert_eq(raw_request(s, TPORT__METHOD__METHOD_PUT_BEGIN, &pq.base,
                           &tport__put_begin_reply__descriptor, msg),
               TPORT_UNAUTHENTICATED, "%s: PutBegin: %s", why, msg);
}

/* A named tensor of alice's, kept for her tenant. */
static void keep_one(tport_client *c)
{
  uint8_t v[4] = {1, 2, 3, 4};
  int64_t sz = 4;
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "kept";
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, sizeof v, &po, NULL, &err), 0, "%s",
               err.msg);
}

/* The default server in this process: the same user needs no set-up, any
 * tenant is theirs, and a raw connection that proves nothing gets nothing. */
Test(local_secret, in_process_default_refuses_without_proof)
{
  char url[128];
  server *srv = svc_start_inproc(url, sizeof url, NULL);
  tport_client *alice = svc_connect(url, "alice");
  keep_one(alice);
  tport_client *ops = svc_connect(url, SVC_OPERATOR);
  tport_counter *st = NULL;
  size_t nst = 0;
  tport_err err;
  cr_assert_eq(tport_stats(ops, &st, &nst, &err), 0, "%s", err.msg);
  free(st);
  tport_close(ops);
  nng_socket s = raw_dial(url);
  refused_everything(s, "no Hello");
  /* a Hello that claims the operator without an answer gets a challenge
   * for the local secret, and nothing else */
  char msg[256];
  Tport__HelloRequest hq = TPORT__HELLO_REQUEST__INIT;
  hq.protocol_version = 1;
  hq.tenant = SVC_OPERATOR;
  cr_assert_eq(raw_request(s, TPORT__METHOD__METHOD_HELLO, &hq.base,
                           &tport__hello_reply__descriptor, msg),
               TPORT_UNAUTHENTICATED, "%s", msg);
  refused_everything(s, "claimed the operator");
  /* a wrong answer */
  hq.tenant = "alice";
  uint8_t wrong[HELLO_MAC_BYTES] = {0};
  hq.auth_response.data = wrong;
  hq.auth_response.len = sizeof wrong;
  cr_assert_eq(raw_request(s, TPORT__METHOD__METHOD_HELLO, &hq.base,
                           &tport__hello_reply__descriptor, msg),
               TPORT_UNAUTHENTICATED, "%s", msg);
  cr_assert(strstr(msg, "wrong local secret"), "%s", msg);
  refused_everything(s, "a wrong answer");
  nng_close(s);
  /* and the right one, on a fresh connection, is alice */
  s = raw_dial(url);
  cr_assert_eq(svc_hello(s, "alice", msg), 0, "%s", msg);
  nng_close(s);
  tport_close(alice);
  server_stop(srv, 1000);
}

/* --local-secret off: claims as before, but never an operator's. */
Test(local_secret, off_takes_claims_but_never_an_operator)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  free(cfg.local_secret);
  cfg.local_secret = NULL;
  server *srv = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = NULL;
  tport_err err;
  cr_assert_eq(tport_connect(url, &(tport_connect_options){.tenant = SVC_OPERATOR}, &c, &err),
               TPORT_PERMISSION_DENIED, "%s", err.msg);
  cr_assert(strstr(err.msg, "operator"), "%s", err.msg);
  tport_client *alice = svc_connect(url, "alice");
  keep_one(alice);
  tport_close(alice);
  server_stop(srv, 1000);
}

/* tportd with its defaults on loopback tcp, its secret in a file of this
 * test's (TPORT_LOCAL_SECRET, read by tportd and libtport alike). */
static pid_t spawn_default(char *url, size_t len, char *secret, size_t slen)
{
  char dir[64];
  fresh_dir(dir, sizeof dir);
  chmod(dir, 0755); /* so that nobody may try, and fail, to read the file */
  snprintf(secret, slen, "%s/local-secret", dir);
  setenv(LOCAL_SECRET_ENV, secret, 1);
  for (int tries = 0; tries < 20; tries++) {
    svc_tcp_url(url, len);
    pid_t pid = svc_spawn(url, NULL);
    if (pid > 0)
      return pid;
  }
  cr_assert_fail("tportd did not start");
  return -1;
}

Test(local_secret, tportd_refuses_clients_without_the_secret)
{
  char url[128], secret[LOCAL_SECRET_PATH_MAX];
  pid_t pid = spawn_default(url, sizeof url, secret, sizeof secret);
  struct stat st;
  cr_assert_eq(stat(secret, &st), 0, "tportd made its secret");
  cr_assert_eq(st.st_mode & 0777, 0600);
  /* the same user: no set-up */
  tport_client *alice = svc_connect(url, "alice");
  keep_one(alice);
  tport_client *c = NULL;
  tport_err err;
  /* another secret file */
  char dir[64], other[LOCAL_SECRET_PATH_MAX];
  fresh_dir(dir, sizeof dir);
  snprintf(other, sizeof other, "%s/local-secret", dir);
  write_file(other, "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n", 0600);
  setenv(LOCAL_SECRET_ENV, other, 1);
  cr_assert_eq(tport_connect(url, &(tport_connect_options){.tenant = "alice"}, &c, &err),
               TPORT_UNAUTHENTICATED, "%s", err.msg);
  cr_assert(strstr(err.msg, "wrong local secret"), "%s", err.msg);
  /* an auth-file secret is no use either: the server asks for its own */
  cr_assert_eq(tport_connect(url,
                             &(tport_connect_options){
                                 .tenant = "alice",
                                 .secret = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554"
                                           "433221100"},
                             &c, &err),
               TPORT_UNAUTHENTICATED, "%s", err.msg);
  /* none: off, or a file that is not there */
  setenv(LOCAL_SECRET_ENV, "off", 1);
  cr_assert_eq(tport_connect(url, &(tport_connect_options){.tenant = SVC_OPERATOR}, &c, &err),
               TPORT_UNAUTHENTICATED, "%s", err.msg);
  cr_assert(strstr(err.msg, "is off"), "%s", err.msg);
  setenv(LOCAL_SECRET_ENV, "/nonexistent/local-secret", 1);
  cr_assert_eq(tport_connect(url, &(tport_connect_options){.tenant = "alice"}, &c, &err),
               TPORT_UNAUTHENTICATED, "%s", err.msg);
  nng_socket s = raw_dial(url);
  refused_everything(s, "tportd, no Hello");
  nng_close(s);
  /* alice's tensor is still there, and hers */
  setenv(LOCAL_SECRET_ENV, secret, 1);
  tport_ref ref = {.name = "kept"};
  tport_tensor_info info;
  cr_assert_eq(tport_info(alice, &ref, &info, &err), 0, "%s", err.msg);
  tport_close(alice);
  cr_assert_eq(svc_terminate(pid), 0);
}

/* A client whose server restarted goes on: nng redials, and libtport says
 * its Hello (the local secret's answer) again on the new connection, as
 * its tenant.  Without that, every request on the new connection was
 * UNAUTHENTICATED (and, with claims, served as tenant "default"). */
Test(local_secret, a_client_says_hello_again_after_the_server_restarts)
{
  char url[128], secret[LOCAL_SECRET_PATH_MAX];
  pid_t pid = spawn_default(url, sizeof url, secret, sizeof secret);
  tport_client *c = svc_connect(url, "alice");
  uint8_t v[64] = {1, 2, 3};
  int64_t n = sizeof v;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, sizeof v, NULL, NULL, &err), 0, "%s",
               err.msg);
  cr_assert_eq(svc_terminate(pid), 0);
  pid = -1;
  for (int tries = 0; tries < 50 && pid <= 0; tries++) {
    pid = svc_spawn(url, NULL); /* the same port: the client redials it */
    if (pid <= 0)
      usleep(100 * 1000);
  }
  cr_assert_gt(pid, 0, "tportd did not start again on %s", url);
  /* one call may go out before the new connection is seen (refused once);
   * every one after it is served */
  int rc = -1, calls = 0;
  tport_tensor_info t;
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "after";
  for (; rc && calls < 40; calls++) {
    rc = tport_put(c, TPORT_UINT8, 1, &n, NULL, v, sizeof v, &po, &t, &err);
    if (rc)
      usleep(250 * 1000);
  }
  cr_assert_eq(rc, 0, "no put served in %d calls after the restart: %s (%s)", calls,
               tport_strerror(rc), err.msg);
  tport_counter *cs = NULL;
  size_t nc = 0;
  cr_assert_eq(tport_stats(c, &cs, &nc, &err), 0, "%s", err.msg);
  free(cs);
  tport_tensor_info *list = NULL;
  size_t nl = 0;
  cr_assert_eq(tport_list(c, &list, &nl, &err), 0, "%s", err.msg);
  cr_assert_eq(nl, 1, "alice's one tensor on the new server");
  free(list);
  /* and as alice, not as "default": another connection of alice's finds
   * the named tensor */
  tport_client *a2 = svc_connect(url, "alice");
  tport_ref ref;
  tport_ref_name(&ref, "after");
  tport_tensor_info got;
  cr_assert_eq(tport_info(a2, &ref, &got, &err), 0, "alice's 'after' from another connection: %s",
               err.msg);
  tport_close(a2);
  tport_close(c);
  cr_assert_eq(svc_terminate(pid), 0);
}

/* Runs the tport CLI as nobody; its exit status, stderr into out. */
static int cli_as_nobody(char *out, size_t len, const char *const *args)
{
  struct passwd *nobody = getpwnam("nobody");
  cr_assert_not_null(nobody);
  int p[2];
  cr_assert_eq(pipe(p), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    dup2(p[1], 2);
    dup2(p[1], 1);
    close(p[0]);
    if (setgroups(0, NULL) != 0 || setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0 ||
        getuid() == 0)
      _exit(99);
    const char *argv[16] = {TPORT_CLI_PATH};
    int n = 1;
    for (int i = 0; args[i] && n < 15; i++)
      argv[n++] = args[i];
    argv[n] = NULL;
    execv(TPORT_CLI_PATH, (char *const *)argv);
    _exit(98);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t k;
  while (n < len - 1 && (k = read(p[0], out + n, len - 1 - n)) > 0)
    n += (size_t)k;
  out[n] = 0;
  close(p[0]);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st));
  return WEXITSTATUS(st);
}

/* The finding itself: a process of another user on this machine, with the
 * tport CLI, can read no tensor of any tenant and see no Stats. */
Test(local_secret, another_user_is_nobody)
{
  if (geteuid() != 0)
    cr_skip_test("needs root to run a child as nobody");
  char url[128], secret[LOCAL_SECRET_PATH_MAX], out[4096];
  pid_t pid = spawn_default(url, sizeof url, secret, sizeof secret);
  tport_client *alice = svc_connect(url, "alice");
  keep_one(alice);
  /* with its own (absent) default secret, and pointed at the owner's file
   * (which it cannot read) */
  const char *envs[] = {NULL, secret};
  for (int e = 0; e < 2; e++) {
    if (envs[e])
      setenv(LOCAL_SECRET_ENV, envs[e], 1);
    else
      unsetenv(LOCAL_SECRET_ENV);
    unsetenv("XDG_RUNTIME_DIR");
    const char *stats[] = {"--url", url, "--tenant", SVC_OPERATOR, "stats", NULL};
    int rc = cli_as_nobody(out, sizeof out, stats);
    cr_assert_eq(rc, 1, "stats as nobody: exit %d: %s", rc, out);
    cr_assert(strstr(out, "UNAUTHENTICATED"), "%s", out);
    const char *get[] = {"--url", url, "--tenant", "alice", "info", "kept", NULL};
    rc = cli_as_nobody(out, sizeof out, get);
    cr_assert_eq(rc, 1, "info as nobody: exit %d: %s", rc, out);
    cr_assert(strstr(out, "UNAUTHENTICATED"), "%s", out);
    const char *rm[] = {"--url", url, "--tenant", "alice", "rm", "kept", NULL};
    rc = cli_as_nobody(out, sizeof out, rm);
    cr_assert_eq(rc, 1, "free as nobody: exit %d: %s", rc, out);
  }
  /* the same CLI as this user works with no set-up */
  setenv(LOCAL_SECRET_ENV, secret, 1);
  tport_ref ref = {.name = "kept"};
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_info(alice, &ref, &info, &err), 0, "%s", err.msg);
  tport_close(alice);
  cr_assert_eq(svc_terminate(pid), 0);
}

/* ---------------------------------------------------------------- relay */

typedef struct relay_client {
  char url[128];
  int rc;
  tport_err err;
} relay_client;

static void *client_main(void *arg)
{
  relay_client *rc = arg;
  tport_client *c = NULL;
  rc->rc = tport_connect(rc->url, &(tport_connect_options){.tenant = "alice", .timeout_ms = 10000},
                         &c, &rc->err);
  tport_close(c);
  return NULL;
}

/* Whoever holds a loopback port the user's client dials (tportd was
 * restarted elsewhere, say) and passes the real server's challenge on gets
 * an answer bound to its own port: the real server refuses it. */
Test(local_secret, a_relayed_answer_is_refused)
{
  char url[128], secret[LOCAL_SECRET_PATH_MAX];
  pid_t pid = spawn_default(url, sizeof url, secret, sizeof secret);
  nng_socket squat, up = raw_dial(url);
  relay_client cl = {.rc = -1};
  cr_assert_eq(nng_rep0_open(&squat), 0);
  nng_socket_set_ms(squat, NNG_OPT_RECVTIMEO, 10000);
  for (int tries = 0; tries < 20; tries++) {
    svc_tcp_url(cl.url, sizeof cl.url);
    if (nng_listen(squat, cl.url, NULL, 0) == 0)
      break;
  }
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, client_main, &cl), 0);
  /* two Hellos through: the client's claim, then its answer */
  int last = -1;
  for (int i = 0; i < 2; i++) {
    nng_msg *m;
    cr_assert_eq(nng_recvmsg(squat, &m, 0), 0, "the client's Hello %d", i);
    cr_assert_eq(nng_sendmsg(up, m, 0), 0);
    cr_assert_eq(nng_recvmsg(up, &m, 0), 0, "the server's reply %d", i);
    char msg[256];
    last = svc_reply_status(m, &tport__hello_reply__descriptor, msg, NULL);
    cr_assert_eq(last, TPORT_UNAUTHENTICATED, "reply %d: %s", i, msg);
    cr_assert_eq(nng_sendmsg(squat, m, 0), 0);
  }
  pthread_join(t, NULL);
  cr_assert_eq(cl.rc, TPORT_UNAUTHENTICATED, "%s", cl.err.msg);
  /* and the relay's own connection proved nothing */
  refused_everything(up, "the relay");
  nng_close(up);
  nng_close(squat);
  cr_assert_eq(svc_terminate(pid), 0);
}
