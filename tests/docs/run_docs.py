#!/usr/bin/python3
"""run_docs.py SOURCE BUILD: every code block of README.md and docs/*.md, run.

A reader copies the blocks of a document one after another from the
checkout's root; so does this test, against a tportd of its own:

- ```sh blocks run with bash (-e, pipefail), ```python blocks with
  /usr/bin/python3, ```c blocks are compiled against the build tree
  (pkg-config's tport-uninstalled, -Wall -Werror) and run; ```text blocks
  are output and are not run.  Each document runs in a scratch directory of
  its own whose entries link to the checkout's (build/ to BUILD), so the
  blocks' paths work as written and what they leave lies in the scratch
  directory, not in the checkout.
- The server: tportd on a free loopback port with devices cpu,sim:2, its own
  local secret, shm socket and metrics port; TPORT_URL names it, so blocks
  written for the default URL reach it; PATH starts with BUILD/bin; the
  Python package and libtport come from the checkout and BUILD.
- README.md runs twice in a row against the same server: a quick start that
  leaves a name behind makes the second pass fail (AlreadyExists).
- A block that cannot run here (make itself, kubectl apply, systemctl,
  podman) carries, on the line right before it,
      <!-- docs-test: not run: REASON -->
  and is checked instead with what can check it: bash -n for shell,
  yamllint for YAML, py_compile for Python, cc -fsyntax-only for C; and
  `check: COMMAND` after the reason runs COMMAND (from the scratch
  directory) as a further check: `kubectl kustomize deploy/k8s`, say.  A
  checking tool that is not installed (yamllint, kubectl and
  systemd-analyze are not among make's dependencies) is reported as a
  skipped check, never as a pass: the line says which.
- Blocks see the server's TPORT_* variables (TPORT_URL, TPORT_LOCAL_SECRET,
  TPORT_SHM_SOCKET, TPORT_HTTP_LISTEN, TPORT_DEVICES): a block that starts a
  tportd of its own gives it --http-listen and --shm-socket (or off).
- `<!-- docs-test: file NAME -->` before a block also writes it to NAME in
  the scratch directory (a C program a later shell block compiles).
- A block of another language, or without one, fails the test: it would
  otherwise be silently never run.

Exit 0 when every block passed; else 1, naming each failed block (document,
line) with its output.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

RUN_LANGS = {"sh", "python", "c"}
CHECK_ONLY_LANGS = {"yaml"}  # configuration: always marked, always linted
# generous: the suites run side by side, and importing torch on a loaded
# machine takes tens of seconds
BLOCK_TIMEOUT_S = 180
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")


class Block:
    def __init__(self, doc, line, lang, text, marker):
        self.doc, self.line, self.lang, self.text = doc, line, lang, text
        self.not_run = None  # the reason, for a block marked not run
        self.check = None  # a further check command, for such a block
        self.file = None  # a name to write the block to
        if marker is None:
            return
        if marker.startswith("not run:"):
            rest = marker[len("not run:"):].strip()
            reason, _, check = rest.partition("check:")
            self.not_run = reason.strip().rstrip(";").strip()
            self.check = check.strip() or None
            if not self.not_run:
                raise ValueError(f"{doc}:{line}: 'not run' without a reason")
        elif marker.startswith("file "):
            self.file = marker[len("file "):].strip()
        else:
            raise ValueError(f"{doc}:{line}: unknown docs-test marker '{marker}'")

    def where(self):
        return f"{self.doc}:{self.line} ({self.lang})"


def extract(path, name):
    """The fenced blocks of a Markdown file, in order, with their markers."""
    blocks, lines = [], open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{name}:{start}: a code block that never ends")
        blocks.append(Block(name, start, lang, "\n".join(lines[i + 1:j]) + "\n",
                            marker.group(1) if marker else None))
        i = j + 1
    return blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """tportd on loopback with a private secret, shm socket and metrics port."""

    def __init__(self, build, tmp):
        self.port, self.http = free_port(), free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.env = {
            "TPORT_URL": self.url,
            "TPORT_LOCAL_SECRET": os.path.join(tmp, "secret", "local-secret"),
            "TPORT_SHM_SOCKET": os.path.join(tmp, "shm", "shm.sock"),
            "TPORT_HTTP_LISTEN": f"127.0.0.1:{self.http}",
            "TPORT_DEVICES": "cpu,sim:2",
        }
        self.log = open(os.path.join(tmp, "tportd.log"), "w+")
        env = dict(os.environ, **self.env)
        self.proc = subprocess.Popen(
            [os.path.join(build, "bin", "tportd"), "--listen", self.url, "--log-level", "1"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tportd exited {self.proc.returncode}:\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"tportd did not listen within 20 s:\n{self.output()}")

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Runner:
    def __init__(self, source, build, tmp, server):
        self.source, self.build, self.tmp, self.server = source, build, tmp, server
        self.failures, self.ran, self.checked, self.skipped = [], 0, 0, 0
        self.env = dict(os.environ, **server.env)
        self.env["PATH"] = os.path.join(build, "bin") + os.pathsep + self.env.get("PATH", "")
        self.env["PKG_CONFIG_PATH"] = build
        self.env["TPORT_LIBRARY"] = os.path.join(build, "lib", "libtport.so")
        self.env["PYTHONPATH"] = os.path.join(source, "python")
        self.env.pop("PYTHONHOME", None)

    def scratch(self, label):
        """A directory that looks like the checkout, with BUILD as build/."""
        d = tempfile.mkdtemp(prefix=label + "-", dir=self.tmp)
        for entry in os.listdir(self.source):
            if entry.startswith(".") or entry.startswith("build"):
                continue
            os.symlink(os.path.join(self.source, entry), os.path.join(d, entry))
        os.symlink(self.build, os.path.join(d, "build"))
        return d

    def sh(self, args, cwd, stdin=None):
        try:
            p = subprocess.run(args, cwd=cwd, env=self.env, input=stdin, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=BLOCK_TIMEOUT_S)
            return p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            return 124, f"(timed out after {BLOCK_TIMEOUT_S} s)\n{e.stdout or ''}"

    def fail(self, block, what, output):
        self.failures.append(f"--- {block.where()}: {what}\n{block.text}--- output:\n{output}")

    def compile_c(self, block, cwd, path, syntax_only=False):
        pc = subprocess.run(["pkg-config", "--cflags", "--libs", "tport-uninstalled"],
                            env=self.env, capture_output=True, text=True)
        if pc.returncode:
            return pc.returncode, pc.stderr, None
        exe = path[:-2] if path.endswith(".c") else path + ".bin"
        args = ["cc", "-std=c11", "-Wall", "-Wextra", "-Werror"]
        args += ["-fsyntax-only", path] if syntax_only else [path, "-o", exe]
        rc, out = self.sh(args + pc.stdout.split(), cwd)
        return rc, out, exe

    def run_block(self, block, cwd, index):
        if block.file:
            with open(os.path.join(cwd, block.file), "w") as f:
                f.write(block.text)
        if block.lang == "sh":
            rc, out = self.sh(["bash", "-e", "-o", "pipefail", "-s"], cwd, block.text)
        elif block.lang == "python":
            rc, out = self.sh(["/usr/bin/python3", "-"], cwd, block.text)
        else:  # c
            path = os.path.join(cwd, block.file or f"block{index}.c")
            with open(path, "w") as f:
                f.write(block.text)
            rc, out, exe = self.compile_c(block, cwd, path)
            if rc:
                self.fail(block, f"does not compile (exit {rc})", out)
                return
            rc, out = self.sh([exe], cwd)
        self.ran += 1
        if rc:
            self.fail(block, f"exit {rc}", out)

    def check_block(self, block, cwd, index):
        """A block that is not run: the checks that can be made here."""
        path = os.path.join(cwd, block.file or f"checked{index}.{block.lang}")
        with open(path, "w") as f:
            f.write(block.text)
        if block.lang == "sh":
            rc, out = self.sh(["bash", "-n", path], cwd)
        elif block.lang == "yaml":
            if not shutil.which("yamllint"):
                self.skip(block, "yamllint is not installed (Debian: yamllint)")
                return
            rc, out = self.sh(["yamllint", "-s", "-d", "{extends: default, rules: {document-start: "
                               "disable, line-length: {max: 110}}}", path], cwd)
        elif block.lang == "python":
            rc, out = self.sh(["/usr/bin/python3", "-m", "py_compile", path], cwd)
        elif block.lang == "c":
            rc, out, _ = self.compile_c(block, cwd, path, syntax_only=True)
        else:
            rc, out = 0, ""
        if rc:
            self.fail(block, f"not run, and its check failed (exit {rc})", out)
        elif block.check:
            rc, out = self.sh(["bash", "-e", "-o", "pipefail", "-c", block.check], cwd)
            if rc == 127:  # bash: command not found
                self.skip(block, f"`{block.check}` needs a tool that is not installed: "
                          f"{out.strip()}")
                return
            if rc:
                self.fail(block, f"not run; its check `{block.check}` failed (exit {rc})", out)
        self.checked += 1

    def skip(self, block, why):
        self.skipped += 1
        print(f"run_docs: {block.where()}: check skipped: {why}", flush=True)

    def run_document(self, name, blocks, label):
        cwd = self.scratch(label)
        for i, block in enumerate(blocks):
            if block.lang == "text":
                continue
            started = time.monotonic()
            self.run_or_check(block, cwd, i)
            print(f"run_docs: {block.where()}: {time.monotonic() - started:.1f} s", flush=True)

    def run_or_check(self, block, cwd, i):
        if block.not_run is not None:
            self.check_block(block, cwd, i)
        elif block.lang in RUN_LANGS:
            self.run_block(block, cwd, i)
        elif block.lang in CHECK_ONLY_LANGS:
            self.fail(block, "a configuration block must be marked not run "
                      "(<!-- docs-test: not run: REASON -->) to be linted", "")
        else:
            self.fail(block, f"language '{block.lang or '(none)'}' is neither run nor "
                      "checked: use sh, python, c or text, or mark it not run", "")

def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, build = (os.path.realpath(a) for a in sys.argv[1:])
    docs = ["README.md"] + sorted(os.path.join("docs", f)
                                  for f in os.listdir(os.path.join(source, "docs"))
                                  if f.endswith(".md"))
    parsed = {name: extract(os.path.join(source, name), name) for name in docs}
    tmp = tempfile.mkdtemp(prefix="tport-docs-")
    server = None
    try:
        os.makedirs(os.path.join(tmp, "secret"), mode=0o700)
        os.makedirs(os.path.join(tmp, "shm"), mode=0o700)
        server = Server(build, tmp)
        runner = Runner(source, build, tmp, server)
        # the README twice in a row: its quick starts clean up after themselves
        runner.run_document("README.md", parsed["README.md"], "readme-1")
        runner.run_document("README.md", parsed["README.md"], "readme-2")
        for name in docs[1:]:
            runner.run_document(name, parsed[name], os.path.basename(name)[:-3])
        rc = server.stop()
        if rc != 0:
            runner.failures.append(f"--- tportd exited {rc}:\n{server.output()}")
        for f in runner.failures:
            print(f, file=sys.stderr)
        total = sum(len(b) for b in parsed.values())
        print(f"run_docs: {len(docs)} documents, {total} blocks (README.md's run twice): "
              f"{runner.ran} runs, "
              f"{runner.checked} checks (not run), {runner.skipped} checks skipped, "
              f"{len(runner.failures)} failures")
        return 1 if runner.failures else 0
    finally:
        if server:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
