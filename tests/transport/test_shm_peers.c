/* transport/shm.c across users: who may hand a region to whom.
 *
 * A server and a client of different users that share the shm socket
 * through a group (--shm-mode 660: the same-pod example of deploy/k8s, the
 * systemd unit's "tensorport" group) must get through, the group being the
 * client's supplementary one (as a pod's fsGroup and a login's groups are);
 * a server of a third user must get nothing.  Each side is a forked process
 * that drops to its own user, so these run as root only (and say so when
 * skipped). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm.h"

#define SERVER_UID 10001
#define CLIENT_UID 10002
#define STRANGER_UID 10003

static char dir[64], path[96];

static void need_root(void)
{
  if (geteuid() != 0)
    cr_skip_test("needs root: each side drops to a user of its own");
}

static void become(uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups)
{
  if (setgroups(ngroups, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
    _exit(90);
}

/* A server as `uid`, primary group SERVER_UID, listening with mode 660:
 * takes `n` handoffs and writes, for each, whether the peer was allowed
 * (1/0) or the handoff failed (-1). */
static pid_t serve(uid_t uid, int n, int report)
{
  pid_t pid = fork();
  if (pid)
    return pid;
  become(uid, SERVER_UID, NULL, 0);
  int s;
  if (transport_shm_listen(path, 0660, &s, NULL) != TPORT_OK)
    _exit(91);
  if (write(report, "L", 1) != 1)
    _exit(92);
  for (int i = 0; i < n; i++) {
    int conn = accept(s, NULL, NULL);
    if (conn < 0)
      _exit(93);
    uint8_t token[TRANSPORT_SHM_TOKEN_BYTES];
    int fd = -1;
    transport_shm_peer peer;
    int8_t verdict = -1;
    if (transport_shm_recv(conn, 5000, token, &fd, &peer, NULL) == TPORT_OK) {
      verdict = transport_shm_peer_allowed(&peer, 0660);
      transport_shm_reply(conn, verdict ? TPORT_OK : TPORT_PERMISSION_DENIED, "");
      close(fd);
    }
    if (write(report, &verdict, 1) != 1)
      _exit(94);
    close(conn);
  }
  _exit(0);
}

/* A client of CLIENT_UID (primary group its own, supplementary `group`)
 * sending one region with transport_shm_send_to(trusted); returns its code. */
static int client_sends(gid_t group, uid_t trusted)
{
  int p[2];
  cr_assert_eq(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {
    become(CLIENT_UID, CLIENT_UID, &group, 1);
    int fd;
    void *base;
    int code = transport_shm_create(4096, &fd, &base, NULL);
    uint8_t token[TRANSPORT_SHM_TOKEN_BYTES] = {7};
    if (!code)
      code = transport_shm_send_to(path, token, fd, 5000, trusted, NULL);
    _exit(write(p[1], &code, sizeof code) == sizeof code ? 0 : 95);
  }
  int code = -1, st;
  cr_assert_eq(read(p[0], &code, sizeof code), (ssize_t)sizeof code);
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client exit %d", st);
  close(p[0]);
  close(p[1]);
  return code;
}

static void setup(uid_t server)
{
  snprintf(dir, sizeof dir, "/tmp/tport-shm-peers-%d", (int)getpid());
  snprintf(path, sizeof path, "%s/shm.sock", dir);
  cr_assert_eq(mkdir(dir, 0750), 0, "%s", strerror(errno));
  cr_assert_eq(chown(dir, server, SERVER_UID), 0);
}

static void teardown_dir(void)
{
  unlink(path);
  rmdir(dir);
}

static int8_t next_verdict(int fd)
{
  int8_t v = -2;
  cr_assert_eq(read(fd, &v, 1), 1);
  return v;
}

Test(shm_peers, a_server_of_another_user_sharing_a_group_gets_its_clients_regions)
{
  need_root();
  setup(SERVER_UID);
  int rep[2];
  cr_assert_eq(pipe(rep), 0);
  pid_t srv = serve(SERVER_UID, 2, rep[1]);
  char l;
  cr_assert_eq(read(rep[0], &l, 1), 1, "the server did not listen");
  /* by default a client hands its regions to its own user and root only */
  cr_assert_eq(client_sends(SERVER_UID, (uid_t)-1), TPORT_PERMISSION_DENIED);
  cr_assert_eq(next_verdict(rep[0]), -1, "the refused handoff carried nothing");
  /* told the server's user (its data connection's peer), it hands it over,
   * and the server lets it in through its supplementary group */
  cr_assert_eq(client_sends(SERVER_UID, SERVER_UID), TPORT_OK);
  cr_assert_eq(next_verdict(rep[0]), 1);
  int st;
  cr_assert_eq(waitpid(srv, &st, 0), srv);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit %d", st);
  teardown_dir();
}

Test(shm_peers, a_third_user_that_took_the_path_gets_nothing)
{
  need_root();
  setup(STRANGER_UID);
  int rep[2];
  cr_assert_eq(pipe(rep), 0);
  pid_t srv = serve(STRANGER_UID, 1, rep[1]);
  char l;
  cr_assert_eq(read(rep[0], &l, 1), 1, "the server did not listen");
  cr_assert_eq(client_sends(SERVER_UID, SERVER_UID), TPORT_PERMISSION_DENIED);
  cr_assert_eq(next_verdict(rep[0]), -1);
  int st;
  cr_assert_eq(waitpid(srv, &st, 0), srv);
  teardown_dir();
}

Test(shm_peers, a_peer_outside_the_group_is_not_allowed)
{
  transport_shm_peer p = {.pid = 1, .uid = 4242, .gid = 4242, .ngroups = 2,
                          .groups = {4243, 4244}};
  cr_assert_not(transport_shm_peer_allowed(&p, 0660));
  p.groups[1] = getegid();
  cr_assert(transport_shm_peer_allowed(&p, 0660), "a supplementary group is the group");
  cr_assert_not(transport_shm_peer_allowed(&p, 0600), "not when the mode leaves the group out");
  p.ngroups = -1; /* the kernel did not say */
  cr_assert_not(transport_shm_peer_allowed(&p, 0660));
}
