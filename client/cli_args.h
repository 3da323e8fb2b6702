/* cli_args.h: tport's command line, parsed: the global flags (the server,
 * the tenant, TLS, --verify, --no-shm, --json) and each command's own,
 * anywhere on the line, before or after the command.
 *
 * One table (cli_args.c) names every flag, its value and the commands that
 * take it; a flag no command takes, or one the command at hand does not
 * take, is a usage error (exit 2) that names it.  A new flag is a row there,
 * a field here and a case in cli_args.c's apply_option.
 */
#ifndef TPORT_CLI_ARGS_H
#define TPORT_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tport.h"

#define CLI_MAX_POSITIONAL 4

typedef struct cli_args {
  /* global: NULL when not on the line (main falls back to $TPORT_*) */
  const char *url, *tenant, *secret_file, *tls_ca, *tls_cert, *tls_key, *tls_server_name;
  bool verify, no_shm, json, help;
  /* the command and its REFs and files */
  const char *command;
  char *pos[CLI_MAX_POSITIONAL];
  int npos;
  /* the commands' own */
  const char *name, *device;
  bool has_dtype, has_format, nonblocking, copy, exact, replace;
  tport_dtype dtype;
  tport_memory_format format;
  uint64_t ttl_ms;
  uint32_t wait_ms; /* get, info: for a name not there yet */
  int nsizes, nstrides;
  int64_t sizes[TPORT_MAX_DIMS], strides[TPORT_MAX_DIMS], offset;
  bool has_sizes, has_strides;
  uint32_t seen; /* a bit for each flag on the line (cli_args.c's table) */
} cli_args;

/* Parses argv (argv[0] the program) into *a.  0, or 2 with err set for a
 * usage error: an unknown flag, a flag the command does not take, a flag
 * without its value, a value that does not parse, too many arguments.  No
 * command is not an error here (a->command NULL), nor an unknown command (cli.c knows the commands). */
int cli_parse(int argc, char **argv, cli_args *a, tport_err *err);

/* Whether a->command takes every flag on the line: 0, or 2 with err set.
 * A flag the command does not take is refused rather than ignored (the user
 * meant something by it); called once the command is known to exist. */
int cli_check_flags(const cli_args *a, tport_err *err);

/* --help's text. */
void cli_usage(FILE *o);

#endif
