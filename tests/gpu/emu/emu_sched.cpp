/*
 * emu_sched.cpp: runs one launch of an emulated kernel (emu.h) on the calling
 * thread: the blocks one after another, the threads of a block as fibers on
 * stacks of their own that switch only at __syncthreads and at their end.
 *
 * Why fibers: a thread suspended in __syncthreads keeps its locals (loop
 * counters, the offsets it computed) on its stack until the block's other
 * threads arrive, with no change to the kernel source.  OS threads would do
 * the same at a thousand times the cost and with real concurrency, which the
 * emulation does not want (see emu.h).
 *
 * Why not ucontext's swapcontext on x86-64: it saves and restores the signal
 * mask with a system call at every switch.  Measured on the CI machine, a
 * block of 256 threads with one barrier costs 1.1 us per thread with
 * swapcontext and 0.08 us with the register switch below (emu_switch, which
 * saves what the SysV ABI says a callee keeps: rbx, rbp, r12-r15, rsp and the
 * SSE/x87 control words).  ucontext remains the portable path, and
 * -DEMU_UCONTEXT selects it on x86-64 too.
 *
 * AddressSanitizer must be told of every switch
 * (__sanitizer_start/finish_switch_fiber): it keeps the bounds of the current
 * stack and would otherwise take a fiber's stack frames for wild accesses.
 */
#include "emu_sched.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__) && !defined(EMU_UCONTEXT)
#define EMU_UCONTEXT 1
#endif
#ifdef EMU_UCONTEXT
#include <ucontext.h>
#endif

emu_dim3 emu_block_idx, emu_thread_idx, emu_block_dim, emu_grid_dim;

namespace
{

constexpr int kMaxThreads = 1024;
// Generous: ASan reports and -O0 frames run on these stacks too.  Only the
// pages a thread touches are ever backed by memory.
constexpr size_t kStack = 256 << 10;
constexpr int kDtypes = 12;

struct fiber {
#ifdef EMU_UCONTEXT
  ucontext_t uc;
#else
  void *sp; // saved by emu_switch while suspended
#endif
  char *stack; // [stack, stack + kStack), a guard page below
  emu_dim3 tid;
  unsigned barriers; // __syncthreads reached in this block
  bool done;
#ifdef EMU_ASAN
  void *fake_stack; // ASan's, while suspended
#endif
};

struct scheduler {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; // one launch at a time
  char *stacks = nullptr;
  fiber f[kMaxThreads];
  int nthreads = 0, cur = 0;
  bool running = false;
  const emu_kernel *k = nullptr;
  void **args = nullptr;
#ifdef EMU_UCONTEXT
  ucontext_t main_uc;
#else
  void *main_sp = nullptr;
  uint32_t mxcsr = 0x1F80, fpcw = 0x037F; // the launching thread's, for new fibers
#endif
#ifdef EMU_ASAN
  void *main_fake_stack = nullptr;
  const void *main_bottom = nullptr;
  size_t main_size = 0;
#endif
  emu_sched_stats st = {};
  char err[256] = "";
};
scheduler S;

// The watchdog: a thread that aborts the process when one launch runs too long.
struct watchdog {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv;
  bool started = false, armed = false;
  unsigned long long generation = 0;
  struct timespec deadline = {};
  double limit = 0;
  char what[200] = "";
};
watchdog W;

emu_kernel g_kernels[kDtypes][kDtypes][3][3]; // [dst][src][16/32/64][kernel]

int width_slot(int idx_bits)
{
  return idx_bits == 16 ? 0 : idx_bits == 32 ? 1 : idx_bits == 64 ? 2 : -1;
}

int name_slot(const char *name)
{
  static const char *const names[3] = {"tport_copy", "tport_transpose", "tport_cast_vec"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(name, names[i]))
      return i;
  return -1;
}

void set_error(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(S.err, sizeof S.err, fmt, ap);
  va_end(ap);
}

#ifndef EMU_UCONTEXT
// emu_switch(save, to): pushes the callee-saved registers and the control
// words, stores the stack pointer in *save, and pops the same from the stack
// at `to` (a suspended fiber, or one made by fresh_stack).
extern "C" void emu_switch(void **save, void *to);
asm(R"(
  .text
  .p2align 4
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
#endif

[[noreturn]] void fiber_entry();

// The scheduler resumes fiber f until its next barrier or its end.
void resume(fiber &f)
{
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(&S.main_fake_stack, f.stack, kStack);
#endif
#ifdef EMU_UCONTEXT
  swapcontext(&S.main_uc, &f.uc);
#else
  emu_switch(&S.main_sp, f.sp);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(S.main_fake_stack, nullptr, nullptr);
#endif
}

// A fiber gives the scheduler back its turn; a finished one never returns.
void suspend(fiber &f, bool finished)
{
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, S.main_bottom, S.main_size);
#endif
#ifdef EMU_UCONTEXT
  swapcontext(&f.uc, &S.main_uc);
#else
  emu_switch(&f.sp, S.main_sp);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &S.main_bottom, &S.main_size);
#endif
}

void fiber_entry()
{
#ifdef EMU_ASAN
  // learns the scheduler's stack, to switch back to it
  __sanitizer_finish_switch_fiber(nullptr, &S.main_bottom, &S.main_size);
#endif
  S.k->fn(S.args);
  fiber &f = S.f[S.cur];
  f.done = true;
  suspend(f, true);
  abort(); // a finished fiber is never resumed
}

// Makes f start at fiber_entry on its own stack the next time it is resumed.
void fresh_stack(fiber &f)
{
#ifdef EMU_UCONTEXT
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack;
  f.uc.uc_stack.ss_size = kStack;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, fiber_entry, 0);
#else
  // What emu_switch pops, top down: a null return address for fiber_entry
  // (it never returns; a null frame ends a backtrace), fiber_entry as the
  // address its ret goes to, six registers, the control words.
  uint64_t *s = reinterpret_cast<uint64_t *>(f.stack + kStack);
  *--s = 0;
  *--s = reinterpret_cast<uint64_t>(&fiber_entry);
  for (int i = 0; i < 6; i++)
    *--s = 0;
  *--s = (uint64_t)S.mxcsr | ((uint64_t)S.fpcw << 32);
  f.sp = s;
#endif
}

bool ensure_stacks()
{
  if (S.stacks)
    return true;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), slot = kStack + page;
  void *m = mmap(nullptr, slot * kMaxThreads, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return false;
  char *base = static_cast<char *>(m);
  for (int i = 0; i < kMaxThreads; i++) {
    mprotect(base + i * slot, page, PROT_NONE); // overflowing a fiber's stack faults
    S.f[i].stack = base + i * slot + page;
  }
  S.stacks = base;
  return true;
}

struct timespec now_plus(double s)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  long long ns = (long long)t.tv_nsec + (long long)((s - (double)(long long)s) * 1e9);
  t.tv_sec += (time_t)s + (time_t)(ns / 1000000000);
  t.tv_nsec = (long)(ns % 1000000000);
  return t;
}

void *watchdog_main(void *)
{
  pthread_mutex_lock(&W.mu);
  for (;;) {
    while (!W.armed)
      pthread_cond_wait(&W.cv, &W.mu);
    unsigned long long g = W.generation;
    int rc = 0;
    while (W.armed && W.generation == g && rc == 0)
      rc = pthread_cond_timedwait(&W.cv, &W.mu, &W.deadline);
    if (W.armed && W.generation == g) {
      fprintf(stderr,
              "emu: %s still runs after %.0f s: a loop that does not end (an index that "
              "wraps?); aborting\n",
              W.what, W.limit);
      abort();
    }
  }
  return nullptr;
}

void watchdog_arm(const emu_kernel *k, emu_dim3 grid, emu_dim3 block)
{
  pthread_mutex_lock(&W.mu);
  if (!W.started) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&W.cv, &a);
    pthread_condattr_destroy(&a);
    if (W.limit <= 0) {
      const char *e = getenv("TPORT_EMU_LAUNCH_SECONDS");
      W.limit = e && atof(e) > 0 ? atof(e) : 20;
    }
    pthread_t t;
    if (pthread_create(&t, nullptr, watchdog_main, nullptr) == 0) {
      pthread_detach(t);
      W.started = true;
    }
  }
  snprintf(W.what, sizeof W.what,
           "%s (dst %d, src %d, %d-bit index), grid (%u,%u,%u) block (%u,%u,%u)", k->name, k->dst,
           k->src, k->idx_bits, grid.x, grid.y, grid.z, block.x, block.y, block.z);
  W.deadline = now_plus(W.limit);
  W.armed = true;
  W.generation++;
  pthread_cond_signal(&W.cv);
  pthread_mutex_unlock(&W.mu);
}

void watchdog_disarm()
{
  pthread_mutex_lock(&W.mu);
  W.armed = false;
  pthread_cond_signal(&W.cv);
  pthread_mutex_unlock(&W.mu);
}

// One block: every thread runs to its first barrier (or its end), then every
// thread still alive to its next, and so on.  A pass over the threads is one
// barrier phase: no thread passes barrier b before all have reached it.
emu_status run_block(unsigned long long linear)
{
  const emu_dim3 bd = emu_block_dim;
  const int n = S.nthreads;
  for (int t = 0; t < n; t++) {
    fiber &f = S.f[t];
    f.tid = {(unsigned)t % bd.x, (unsigned)t / bd.x % bd.y, (unsigned)t / (bd.x * bd.y)};
    f.barriers = 0;
    f.done = false;
    fresh_stack(f);
  }
  const bool reverse = linear & 1; // see emu.h: exposes order dependence
  for (;;) {
    int alive = 0;
    for (int i = 0; i < n; i++) {
      const int t = reverse ? n - 1 - i : i;
      fiber &f = S.f[t];
      if (f.done)
        continue;
      S.cur = t;
      emu_thread_idx = f.tid;
      resume(f);
      alive += !f.done;
    }
    if (!alive)
      break;
  }
  S.st.blocks++;
  S.st.threads += (unsigned long long)n;
  for (int t = 1; t < n; t++)
    if (S.f[t].barriers != S.f[0].barriers) {
      set_error("%s: in block (%u,%u,%u), thread %d reached %u barriers and thread 0 %u", S.k->name,
                emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, t, S.f[t].barriers,
                S.f[0].barriers);
      return EMU_DIVERGENT_BARRIER;
    }
  return EMU_OK;
}

} // namespace

extern "C" {

void emu_syncthreads(void)
{
  if (!S.running) {
    fprintf(stderr, "emu: __syncthreads() called outside a kernel\n");
    abort();
  }
  fiber &f = S.f[S.cur];
  f.barriers++;
  S.st.barriers++;
  suspend(f, false);
}

void emu_register_kernel(int dst, int src, int idx_bits, const char *name, emu_kernel_fn fn)
{
  const int w = width_slot(idx_bits), k = name_slot(name);
  if (dst < 0 || dst >= kDtypes || src < 0 || src >= kDtypes || w < 0 || k < 0) {
    fprintf(stderr, "emu: cannot register %s (dst %d, src %d, %d-bit index)\n", name, dst, src,
            idx_bits);
    abort();
  }
  g_kernels[dst][src][w][k] = emu_kernel{dst, src, idx_bits, name, fn};
}

const emu_kernel *emu_find_kernel(int dst, int src, int idx_bits, const char *name)
{
  const int w = width_slot(idx_bits), k = name ? name_slot(name) : -1;
  if (dst < 0 || dst >= kDtypes || src < 0 || src >= kDtypes || w < 0 || k < 0)
    return nullptr;
  const emu_kernel *e = &g_kernels[dst][src][w][k];
  return e->fn ? e : nullptr;
}

emu_status emu_run(const emu_kernel *k, emu_dim3 grid, emu_dim3 block, void **args)
{
  pthread_mutex_lock(&S.mu);
  S.err[0] = 0;
  const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || threads > kMaxThreads) {
    set_error("%s: grid (%u,%u,%u) block (%u,%u,%u) is not a valid launch", k->name, grid.x, grid.y,
              grid.z, block.x, block.y, block.z);
    pthread_mutex_unlock(&S.mu);
    return EMU_BAD_CONFIG;
  }
  if (!ensure_stacks()) {
    fprintf(stderr, "emu: no memory for %d fiber stacks\n", kMaxThreads);
    abort();
  }
#ifndef EMU_UCONTEXT
  asm volatile("stmxcsr %0" : "=m"(S.mxcsr));
  asm volatile("fnstcw %0" : "=m"(S.fpcw));
#endif
  S.k = k;
  S.args = args;
  S.nthreads = (int)threads;
  emu_grid_dim = grid;
  emu_block_dim = block;
  S.running = true;
  S.st.launches++;
  watchdog_arm(k, grid, block);
  emu_status rc = EMU_OK;
  unsigned long long linear = 0;
  for (unsigned z = 0; z < grid.z && !rc; z++)
    for (unsigned y = 0; y < grid.y && !rc; y++)
      for (unsigned x = 0; x < grid.x && !rc; x++) {
        emu_block_idx = {x, y, z};
        rc = run_block(linear++);
      }
  watchdog_disarm();
  S.running = false;
  pthread_mutex_unlock(&S.mu);
  return rc;
}

const char *emu_last_error(void)
{
  return S.err;
}

void emu_set_watchdog(double seconds)
{
  pthread_mutex_lock(&W.mu);
  W.limit = seconds;
  pthread_mutex_unlock(&W.mu);
}

void emu_get_sched_stats(emu_sched_stats *out)
{
  pthread_mutex_lock(&S.mu);
  *out = S.st;
  pthread_mutex_unlock(&S.mu);
}

} // extern "C"
