/*
 * shm.c: memfd regions and their handoff over a Unix socket (shm.h).
 */
#define _GNU_SOURCE
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HANDOFF_BYTES (4 + 4 + TRANSPORT_SHM_TOKEN_BYTES)
#define REPLY_MSG_MAX 512
/* a client that sends more descriptors than this has them closed all the same */
#define MAX_FDS 8

static const uint8_t magic[4] = {'T', 'P', 'S', 'H'};

static void put_u32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is readable (POLLIN) or writable, up to the deadline. */
static int wait_fd(int fd, short events, int64_t deadline, tport_err *err)
{
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left < 0)
      left = 0;
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, (int)(left > 60000 ? 60000 : left));
    if (n > 0)
      return TPORT_OK;
    if (n == 0 && now_ms() >= deadline)
      return tport_err_set(err, TPORT_DEADLINE_EXCEEDED, "the shm socket did not answer in time");
    if (n < 0 && errno != EINTR)
      return tport_err_set(err, TPORT_UNAVAILABLE, "poll on the shm socket: %s", strerror(errno));
  }
}

/* Reads exactly n bytes (no descriptors expected). */
static int read_full(int fd, void *buf, size_t n, int64_t deadline, tport_err *err)
{
  uint8_t *p = buf;
  while (n) {
    int rc = wait_fd(fd, POLLIN, deadline, err);
    if (rc)
      return rc;
    ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0)
      return tport_err_set(err, TPORT_UNAVAILABLE, "the shm socket closed mid-message");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      return tport_err_set(err, TPORT_UNAVAILABLE, "recv on the shm socket: %s", strerror(errno));
    }
    p += got;
    n -= (size_t)got;
  }
  return TPORT_OK;
}

static int sun_of(const char *path, struct sockaddr_un *sa, tport_err *err)
{
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (!path || !*path || strlen(path) >= sizeof sa->sun_path)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "shm socket path '%.120s' is empty or longer than %zu bytes",
                         path ? path : "", sizeof sa->sun_path - 1);
  memcpy(sa->sun_path, path, strlen(path));
  return TPORT_OK;
}

static int peer_of(int fd, transport_shm_peer *peer, tport_err *err)
{
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
    return tport_err_set(err, TPORT_INTERNAL, "SO_PEERCRED: %s", strerror(errno));
  peer->pid = cr.pid;
  peer->uid = cr.uid;
  peer->gid = cr.gid;
  socklen_t glen = sizeof peer->groups;
  peer->ngroups = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer->groups, &glen) == 0
                      ? (int)(glen / sizeof(gid_t))
                      : -1;
  return TPORT_OK;
}

/* ---------------------------------------------------------------- client */

int transport_shm_create(size_t nbytes, int *fd_out, void **base_out, tport_err *err)
{
  if (nbytes == 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a region holds at least one byte");
  if (nbytes > (size_t)INT64_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a region of %zu bytes is too large", nbytes);
  int fd = memfd_create("tport-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "memfd_create: %s", strerror(errno));
  int rc = TPORT_OK;
  if (ftruncate(fd, (off_t)nbytes) != 0)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "a %zu-byte region: %s", nbytes,
                       strerror(errno));
  else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    rc = tport_err_set(err, TPORT_INTERNAL, "sealing the region: %s", strerror(errno));
  void *base = MAP_FAILED;
  if (!rc && (base = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "mapping a %zu-byte region: %s", nbytes,
                       strerror(errno));
  if (rc) {
    close(fd);
    return rc;
  }
  *fd_out = fd;
  *base_out = base;
  return TPORT_OK;
}

/* Reads the server's answer to a handoff into *rc; false when none came
 * (*rc then says why). */
static bool read_answer(int s, int64_t deadline, tport_err *err, int *rc)
{
  uint8_t head[8];
  if ((*rc = read_full(s, head, sizeof head, deadline, err)) != TPORT_OK)
    return false;
  uint32_t code = get_u32(head), len = get_u32(head + 4);
  char text[REPLY_MSG_MAX + 1] = "";
  if (len > REPLY_MSG_MAX) {
    *rc = tport_err_set(err, TPORT_INTERNAL, "the shm socket answered a %u-byte message", len);
    return true;
  }
  if ((*rc = read_full(s, text, len, deadline, err)) != TPORT_OK)
    return false;
  text[len] = 0;
  if (code > TPORT_UNAUTHENTICATED)
    *rc = tport_err_set(err, TPORT_INTERNAL, "the shm socket answered code %u", code);
  else if (code != TPORT_OK)
    *rc = tport_err_set(err, (int)code, "the server refused the region: %s", text);
  else
    *rc = TPORT_OK;
  return true;
}

int transport_shm_send(const char *path, const uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], int fd,
                       int timeout_ms, tport_err *err)
{
  return transport_shm_send_to(path, token, fd, timeout_ms, (uid_t)-1, err);
}

int transport_shm_send_to(const char *path, const uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], int fd,
                          int timeout_ms, uid_t server_uid, tport_err *err)
{
  struct sockaddr_un sa;
  int rc = sun_of(path, &sa, err);
  if (rc)
    return rc;
  int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 10000);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "socket: %s", strerror(errno));
  if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
    rc = tport_err_set(err, TPORT_UNAVAILABLE, "cannot reach the shm socket %s: %s", path,
                       strerror(errno));
    goto out;
  }
  /* the region goes only to a server of this user, root, or the user the
   * client's data connection reaches */
  transport_shm_peer peer = {0};
  if ((rc = peer_of(s, &peer, err)) != TPORT_OK)
    goto out;
  if (peer.uid != geteuid() && peer.uid != 0 &&
      (server_uid == (uid_t)-1 || peer.uid != server_uid)) {
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "the shm socket %s is served by uid %u, not by this user (%u), root or "
                       "the server's user: no region is handed to it",
                       path, (unsigned)peer.uid, (unsigned)geteuid());
    goto out;
  }
  uint8_t msg[HANDOFF_BYTES];
  memcpy(msg, magic, 4);
  put_u32(msg + 4, TRANSPORT_SHM_VERSION);
  memcpy(msg + 8, token, TRANSPORT_SHM_TOKEN_BYTES);
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = ctl.buf,
                      .msg_controllen = sizeof ctl.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if ((rc = wait_fd(s, POLLOUT, deadline, err)) != TPORT_OK)
    goto out;
  ssize_t sent;
  do
    sent = sendmsg(s, &mh, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  if (sent != (ssize_t)sizeof msg) {
    int e = sent < 0 ? errno : 0;
    /* a busy server answers and closes without reading (regions.c): its
     * answer may be waiting here already, and it says more than EPIPE */
    if ((e == EPIPE || e == ECONNRESET) && read_answer(s, now_ms(), err, &rc))
      goto out;
    rc = tport_err_set(err, TPORT_UNAVAILABLE, "sending the region: %s",
                       e ? strerror(e) : "a short write");
    goto out;
  }
  read_answer(s, deadline, err, &rc);
out:
  close(s);
  return rc;
}

/* ---------------------------------------------------------------- server */

/* Creates the socket's directory when missing: private, but for the group
 * or others when the socket's mode lets them in. */
static int make_parent(const char *path, unsigned mode, tport_err *err)
{
  char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir)
    return TPORT_OK;
  *slash = 0;
  struct stat st;
  if (stat(dir, &st) == 0)
    return S_ISDIR(st.st_mode) ? TPORT_OK
                               : tport_err_set(err, TPORT_INVALID_ARGUMENT,
                                               "%s is not a directory", dir);
  mode_t dm = 0700 | ((mode & 0060) ? 0050 : 0) | ((mode & 0006) ? 0005 : 0);
  if (mkdir(dir, dm) != 0 && errno != EEXIST)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cannot create %s: %s", dir,
                         strerror(errno));
  chmod(dir, dm); /* whatever the umask took */
  return TPORT_OK;
}

/* A socket file left by a server that is gone is replaced; a live one, or
 * anything that is not a socket, is an error. */
static int clear_stale(const char *path, const struct sockaddr_un *sa, tport_err *err)
{
  struct stat st;
  if (lstat(path, &st) != 0)
    return errno == ENOENT ? TPORT_OK
                           : tport_err_set(err, TPORT_UNAVAILABLE, "%s: %s", path,
                                           strerror(errno));
  if (!S_ISSOCK(st.st_mode))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "%s exists and is not a socket: not replaced", path);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "socket: %s", strerror(errno));
  int live = connect(s, (const struct sockaddr *)sa, sizeof *sa) == 0;
  int why = errno;
  close(s);
  if (live || why != ECONNREFUSED)
    return tport_err_set(err, TPORT_UNAVAILABLE,
                         "%s: another server is listening there%s%s", path,
                         live ? "" : " (", live ? "" : strerror(why));
  unlink(path);
  return TPORT_OK;
}

int transport_shm_listen(const char *path, unsigned mode, int *fd_out, tport_err *err)
{
  struct sockaddr_un sa;
  int rc = sun_of(path, &sa, err);
  if (!rc)
    rc = make_parent(path, mode, err);
  if (!rc)
    rc = clear_stale(path, &sa, err);
  if (rc)
    return rc;
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "socket: %s", strerror(errno));
  /* Linux gives the socket file the socket inode's mode (less the umask):
   * never wider than asked, even between bind and chmod */
  fchmod(s, (mode_t)(mode & 0777));
  if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(path, (mode_t)(mode & 0777)) != 0 ||
      listen(s, 64) != 0) {
    rc = tport_err_set(err, TPORT_UNAVAILABLE, "cannot listen on the shm socket %s: %s", path,
                       strerror(errno));
    close(s);
    return rc;
  }
  *fd_out = s;
  return TPORT_OK;
}

bool transport_shm_peer_allowed(const transport_shm_peer *peer, unsigned mode)
{
  if (peer->uid == geteuid() || peer->uid == 0)
    return true;
  if (mode & 0060) {
    gid_t g = getegid();
    if (peer->gid == g)
      return true;
    for (int i = 0; i < peer->ngroups && i < TRANSPORT_SHM_PEER_GROUPS; i++)
      if (peer->groups[i] == g)
        return true;
  }
  return (mode & 0006) != 0;
}

int transport_shm_recv(int conn, int timeout_ms, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES],
                       int *fd_out, transport_shm_peer *peer, tport_err *err)
{
  int64_t deadline = now_ms() + timeout_ms;
  int rc = peer_of(conn, peer, err);
  if (rc)
    return rc;
  uint8_t msg[HANDOFF_BYTES];
  int fds[MAX_FDS], nfds = 0;
  bool truncated = false;
  size_t have = 0;
  /* the descriptor comes with the first byte; the rest may follow apart */
  while (!rc && have < sizeof msg) {
    if ((rc = wait_fd(conn, POLLIN, deadline, err)) != TPORT_OK)
      break;
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    } ctl;
    struct iovec iov = {.iov_base = msg + have, .iov_len = sizeof msg - have};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t got = recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      rc = tport_err_set(err, TPORT_UNAVAILABLE, "recvmsg: %s", strerror(errno));
      break;
    }
    if (mh.msg_flags & MSG_CTRUNC)
      truncated = true;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; i++) {
        int f;
        memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
        if (nfds < MAX_FDS)
          fds[nfds++] = f;
        else
          close(f);
      }
    }
    if (got == 0) {
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "the handoff ended after %zu of %d bytes",
                         have, HANDOFF_BYTES);
      break;
    }
    have += (size_t)got;
  }
  if (!rc && (memcmp(msg, magic, 4) != 0 || get_u32(msg + 4) != TRANSPORT_SHM_VERSION))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "not a tensorport region handoff (magic TPSH, version %d)",
                       TRANSPORT_SHM_VERSION);
  if (!rc && (truncated || nfds != 1))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "a handoff carries exactly one descriptor (%d came%s)", nfds,
                       truncated ? ", and more were cut off" : "");
  if (rc) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    return rc;
  }
  memcpy(token, msg + 8, TRANSPORT_SHM_TOKEN_BYTES);
  *fd_out = fds[0];
  return TPORT_OK;
}

void transport_shm_reply(int conn, int code, const char *msg)
{
  size_t len = msg ? strnlen(msg, REPLY_MSG_MAX) : 0;
  uint8_t buf[8 + REPLY_MSG_MAX];
  put_u32(buf, (uint32_t)code);
  put_u32(buf + 4, (uint32_t)len);
  if (len)
    memcpy(buf + 8, msg, len);
  ssize_t n;
  do
    n = send(conn, buf, 8 + len, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
}

int transport_shm_check(int fd, size_t nbytes, tport_err *err)
{
  struct stat st;
  if (fstat(fd, &st) != 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "fstat of the region: %s", strerror(errno));
  if (!S_ISREG(st.st_mode))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region is not a memfd (not even a regular file)");
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region is not a memfd: it has no seals (%s); create it with "
                         "memfd_create(MFD_ALLOW_SEALING)",
                         strerror(errno));
  if (!(seals & F_SEAL_SHRINK))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region is not sealed against shrinking (F_SEAL_SHRINK): it could "
                         "be cut under the server's mapping");
  if (!(seals & F_SEAL_SEAL))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region's seals are not sealed (F_SEAL_SEAL)");
#ifdef F_SEAL_FUTURE_WRITE
  if (seals & F_SEAL_FUTURE_WRITE)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region is sealed against writing: gets write into regions");
#endif
  if (seals & F_SEAL_WRITE)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region is sealed against writing: gets write into regions");
  if (st.st_size < 0 || (uint64_t)st.st_size < (uint64_t)nbytes)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the region holds %lld bytes: %zu were registered",
                         (long long)st.st_size, nbytes);
  return TPORT_OK;
}
