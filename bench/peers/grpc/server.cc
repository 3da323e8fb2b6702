// server.cc: the gRPC peer's server for bench/run transfer (gRPC C++ 1.51,
// synchronous API, the defaults a plain deployment uses; insecure credentials
// because the tensorport rows it is compared with run without TLS too).
//
// What a put sends is kept in memory: on a put's first chunk the server
// allocates a buffer of the tensor's size, per put, and copies every chunk's
// bytes into it at the chunk's offset (no memset: the copies touch it first).
// The buffer lives until Free.  A get streams a kept buffer back in chunks of
// the size the client asks for.  How the buffer is allocated follows tportd's
// cpu backend (--alloc):
//   cached (the default; tportd since its host cache, engine/host_cache.c):
//          blocks of 1 MiB or more are mapped 2 MiB aligned with transparent
//          huge pages asked for (madvise), and kept when freed for the next
//          put that fits (within a quarter of its size, best fit), so a warm
//          put of a size seen before faults no page; smaller ones are
//          aligned_alloc(256, ...).
//   fresh: aligned_alloc(256, size rounded up to 256) per put and free() on
//          Free (tportd before its host cache): a large buffer is a fresh
//          mmap whose pages fault in on the first copy.
//
//   tport-grpc-peer-server [--tcp HOST:PORT] [--unix unix:PATH] [--alloc cached|fresh]
//
// Prints one line once it listens: {"tcp": "127.0.0.1:PORT", "unix": "unix:PATH"}
// (PORT chosen by the kernel when given as 0), then serves until stdin closes
// or it is signalled.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "peer.grpc.pb.h"

namespace
{

constexpr int kMaxMessage = 64 << 20; // over any chunk the benchmark sends

struct Kept {
  void *data = nullptr;
  size_t bytes = 0;
};

// The buffers of puts: see --alloc above.  Thread-safe.
class Buffers
{
public:
  explicit Buffers(bool cached) : cached_(cached) {}
  ~Buffers()
  {
    for (auto &kv : free_)
      munmap(kv.second, kv.first);
  }

  void *Alloc(size_t bytes)
  {
    if (!cached_ || bytes < kMin)
      return std::aligned_alloc(256, (bytes + 255) & ~size_t(255));
    size_t size = (bytes + kHuge - 1) & ~(kHuge - 1);
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first - size <= size / 4) {
        void *p = it->second;
        used_[p] = it->first;
        free_.erase(it);
        return p;
      }
    }
    size_t len = size + kHuge;
    char *m = static_cast<char *>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (m == MAP_FAILED)
      return nullptr;
    uintptr_t start = (reinterpret_cast<uintptr_t>(m) + kHuge - 1) & ~(uintptr_t)(kHuge - 1);
    size_t head = start - reinterpret_cast<uintptr_t>(m);
    if (head)
      munmap(m, head);
    if (len - head > size)
      munmap(reinterpret_cast<char *>(start) + size, len - head - size);
    void *p = reinterpret_cast<void *>(start);
    madvise(p, size, MADV_HUGEPAGE);
    std::lock_guard<std::mutex> g(mu_);
    used_[p] = size;
    return p;
  }

  void Free(void *p)
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = used_.find(p);
    if (it == used_.end()) {
      std::free(p); // a small block, or --alloc fresh
      return;
    }
    free_.emplace(it->second, p);
    used_.erase(it);
  }

private:
  static constexpr size_t kMin = size_t(1) << 20;
  static constexpr size_t kHuge = size_t(2) << 20;
  bool cached_;
  std::mutex mu_;
  std::map<void *, size_t> used_;
  std::multimap<size_t, void *> free_;
};

class PeerService final : public tport_grpc_peer::BytePeer::Service
{
public:
  explicit PeerService(bool cached) : buffers_(cached) {}
  ~PeerService() override
  {
    for (auto &kv : kept_)
      buffers_.Free(kv.second.data);
  }

  grpc::Status Put(grpc::ServerContext *, grpc::ServerReader<tport_grpc_peer::Chunk> *reader,
                   tport_grpc_peer::PutReply *reply) override
  {
    tport_grpc_peer::Chunk c;
    Kept k;
    size_t got = 0;
    while (reader->Read(&c)) {
      if (!k.data) {
        if (c.total() == 0)
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "first chunk has no total");
        k.bytes = c.total();
        k.data = buffers_.Alloc(k.bytes);
        if (!k.data)
          return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "cannot allocate");
      }
      const std::string &d = c.data();
      if (c.offset() > k.bytes || d.size() > k.bytes - c.offset()) {
        buffers_.Free(k.data);
        return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "chunk past the end");
      }
      std::memcpy(static_cast<char *>(k.data) + c.offset(), d.data(), d.size());
      got += d.size();
    }
    if (got != k.bytes) {
      buffers_.Free(k.data);
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "short put");
    }
    std::string ref = NewRef();
    {
      std::lock_guard<std::mutex> g(mu_);
      kept_[ref] = k;
    }
    reply->set_ref(ref);
    reply->set_bytes(got);
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext *, const tport_grpc_peer::GetRequest *req,
                   grpc::ServerWriter<tport_grpc_peer::Chunk> *writer) override
  {
    Kept k;
    if (!Find(req->ref(), &k))
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such ref");
    size_t chunk = req->chunk_bytes() ? req->chunk_bytes() : (size_t)4 << 20;
    tport_grpc_peer::Chunk c;
    c.set_total(k.bytes);
    for (size_t off = 0; off < k.bytes; off += chunk) {
      size_t n = k.bytes - off < chunk ? k.bytes - off : chunk;
      c.set_offset(off);
      c.set_data(static_cast<const char *>(k.data) + off, n);
      if (!writer->Write(c))
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    return grpc::Status::OK;
  }

  grpc::Status Info(grpc::ServerContext *, const tport_grpc_peer::Ref *req,
                    tport_grpc_peer::InfoReply *reply) override
  {
    Kept k;
    if (!Find(req->ref(), &k))
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such ref");
    reply->set_ref(req->ref());
    reply->set_dtype(1); // uint8
    reply->add_sizes(static_cast<int64_t>(k.bytes));
    reply->add_strides(1);
    reply->set_device("cpu");
    reply->set_nbytes(k.bytes);
    reply->set_memory_format(0);
    return grpc::Status::OK;
  }

  grpc::Status Free(grpc::ServerContext *, const tport_grpc_peer::Ref *req,
                    tport_grpc_peer::Empty *) override
  {
    void *p = nullptr;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = kept_.find(req->ref());
      if (it == kept_.end())
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such ref");
      p = it->second.data;
      kept_.erase(it);
    }
    buffers_.Free(p);
    return grpc::Status::OK;
  }

private:
  bool Find(const std::string &ref, Kept *out)
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = kept_.find(ref);
    if (it == kept_.end())
      return false;
    *out = it->second;
    return true;
  }

  std::string NewRef()
  {
    std::lock_guard<std::mutex> g(mu_);
    std::string r(16, '\0');
    for (size_t i = 0; i < 16; i += 8) {
      uint64_t v = rng_();
      std::memcpy(&r[i], &v, 8);
    }
    return r;
  }

  Buffers buffers_;
  std::mutex mu_;
  std::map<std::string, Kept> kept_;
  std::mt19937_64 rng_{std::random_device{}()};
};

} // namespace

int main(int argc, char **argv)
{
  std::string tcp = "127.0.0.1:0", unix_addr;
  bool cached = true;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--tcp") && i + 1 < argc)
      tcp = argv[++i];
    else if (!std::strcmp(argv[i], "--unix") && i + 1 < argc)
      unix_addr = argv[++i];
    else if (!std::strcmp(argv[i], "--alloc") && i + 1 < argc &&
             (!std::strcmp(argv[i + 1], "cached") || !std::strcmp(argv[i + 1], "fresh")))
      cached = !std::strcmp(argv[++i], "cached");
    else {
      std::fprintf(stderr, "tport-grpc-peer-server: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  PeerService service(cached);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(tcp, grpc::InsecureServerCredentials(), &port);
  if (!unix_addr.empty())
    b.AddListeningPort(unix_addr, grpc::InsecureServerCredentials());
  b.SetMaxReceiveMessageSize(kMaxMessage);
  b.SetMaxSendMessageSize(kMaxMessage);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "tport-grpc-peer-server: cannot listen on %s\n", tcp.c_str());
    return 1;
  }
  std::string host = tcp.substr(0, tcp.rfind(':'));
  std::printf("{\"tcp\": \"%s:%d\", \"unix\": \"%s\", \"alloc\": \"%s\"}\n", host.c_str(), port,
              unix_addr.c_str(), cached ? "cached" : "fresh");
  std::fflush(stdout);
  // Serve until whoever started us closes our stdin (bench/run, or a kill).
  std::thread stop([&server] {
    char buf[64];
    while (std::fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    server->Shutdown();
  });
  server->Wait();
  stop.join();
  return 0;
}
