/*
 * replay_main.c: a main() for a libFuzzer harness without libFuzzer.
 *
 * Every build (gcc included, no sanitizer needed) links each harness with
 * this file, and ctest runs it over the checked-in seed corpus and
 * tests/fuzz/regressions/<harness>/: so every input that ever crashed stays
 * a regression test in `make test`, and runs under ASan/UBSan in `make
 * test-sanitize`.  Arguments are files or directories (not recursive); the
 * exit status is nonzero only when an argument cannot be read (a crash
 * aborts the process, as under libFuzzer).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_target.h"

static int replay_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: %s: cannot open\n", path);
    return -1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      uint8_t *bigger = realloc(buf, cap * 2);
      if (!bigger) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = bigger;
      cap *= 2;
    }
  }
  fclose(f);
  if (!buf) {
    fprintf(stderr, "replay: %s: out of memory\n", path);
    return -1;
  }
  /* an exact-size copy, so that ASan sees a read past the input's end */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int cmp_names(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays a directory's regular files in name order (a stable order makes a
 * failure reproducible).  Returns the count, or -1. */
static int replay_dir(const char *dir)
{
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: %s: cannot open\n", dir);
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.')
      continue; /* ., .. and dotfiles (a README in a corpus would be hidden) */
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **bigger = realloc(names, cap * sizeof *names);
      if (!bigger)
        break;
      names = bigger;
    }
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_names);
  int count = 0;
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (names[i] && stat(path, &st) == 0 && S_ISREG(st.st_mode) && replay_file(path) == 0)
      count++;
    free(names[i]);
  }
  free(names);
  return count;
}

int main(int argc, char **argv)
{
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  int total = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
      bad++;
      continue;
    }
    int n = S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : replay_file(argv[i]) == 0 ? 1 : -1;
    if (n < 0)
      bad++;
    else
      total += n;
  }
  printf("replay: %d inputs ran without a finding\n", total);
  return bad ? 1 : 0;
}
