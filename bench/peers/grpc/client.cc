// client.cc: the gRPC peer's client, driven line by line by
// tport-bench-transfer so that its transfers interleave rep by rep with
// tensorport's in the same run.  gRPC C++ 1.51, synchronous API, insecure
// channels (the tensorport rows run without TLS too), default channel
// arguments except the max message sizes, which are raised over the chunk.
//
//   tport-grpc-peer-client --tcp HOST:PORT [--unix unix:PATH] --chunk BYTES
//
// Once both channels are connected and warm (a 1 MiB put/get/free and a few
// Info calls on each), it prints "ready".  Then, one command a line on stdin,
// one answer a line on stdout (T is tcp or ipc, ipc meaning the unix socket):
//   xfer T N   put N bytes (client-streaming, CHUNK bytes a message), get them
//              back (server-streaming), check them, free them; answers
//              "PUT_SECONDS GET_SECONDS" (the free is not timed), or "error ...".
//   info T K   K unary Info round trips; answers the K times in seconds.
//   quit
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "peer.grpc.pb.h"

namespace
{

constexpr int kMaxMessage = 64 << 20;
using Clock = std::chrono::steady_clock;
using tport_grpc_peer::BytePeer;

double Since(Clock::time_point t0)
{
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Buffers {
  std::vector<char> src, back;
};

class Peer
{
public:
  Peer(const std::string &target, size_t chunk) : chunk_(chunk)
  {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessage);
    args.SetMaxSendMessageSize(kMaxMessage);
    channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    stub_ = BytePeer::NewStub(channel_);
  }

  bool Connect()
  {
    return channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  // Streams n bytes of src as one put; *ref names what the server kept.
  grpc::Status Put(const char *src, size_t n, std::string *ref)
  {
    grpc::ClientContext ctx;
    tport_grpc_peer::PutReply reply;
    std::unique_ptr<grpc::ClientWriter<tport_grpc_peer::Chunk>> w = stub_->Put(&ctx, &reply);
    tport_grpc_peer::Chunk c;
    c.set_total(n);
    for (size_t off = 0; off < n; off += chunk_) {
      size_t len = n - off < chunk_ ? n - off : chunk_;
      c.set_offset(off);
      c.set_data(src + off, len);
      if (!w->Write(c))
        break; // the stream broke: Finish says why
    }
    w->WritesDone();
    grpc::Status s = w->Finish();
    if (s.ok() && reply.bytes() != n)
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "server kept a different size");
    *ref = reply.ref();
    return s;
  }

  grpc::Status Get(const std::string &ref, char *dst, size_t n)
  {
    grpc::ClientContext ctx;
    tport_grpc_peer::GetRequest req;
    req.set_ref(ref);
    req.set_chunk_bytes(chunk_);
    std::unique_ptr<grpc::ClientReader<tport_grpc_peer::Chunk>> r = stub_->Get(&ctx, req);
    tport_grpc_peer::Chunk c;
    size_t got = 0;
    while (r->Read(&c)) {
      const std::string &d = c.data();
      if (c.offset() > n || d.size() > n - c.offset()) {
        ctx.TryCancel();
        break;
      }
      std::memcpy(dst + c.offset(), d.data(), d.size());
      got += d.size();
    }
    grpc::Status s = r->Finish();
    if (s.ok() && got != n)
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "short get");
    return s;
  }

  grpc::Status Info(const std::string &ref)
  {
    grpc::ClientContext ctx;
    tport_grpc_peer::Ref req;
    tport_grpc_peer::InfoReply reply;
    req.set_ref(ref);
    return stub_->Info(&ctx, req, &reply);
  }

  grpc::Status Free(const std::string &ref)
  {
    grpc::ClientContext ctx;
    tport_grpc_peer::Ref req;
    tport_grpc_peer::Empty reply;
    req.set_ref(ref);
    return stub_->Free(&ctx, req, &reply);
  }

  std::string small_ref; // a 4-byte tensor kept for the Info rows

private:
  size_t chunk_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<BytePeer::Stub> stub_;
};

Buffers &BuffersFor(size_t n)
{
  static std::map<size_t, Buffers> cache;
  Buffers &b = cache[n];
  if (b.src.size() != n) {
    b.src.assign(n, 7);
    b.back.assign(n, 0);
  }
  return b;
}

// One rep: put (timed), get (timed), check, free.
std::string Xfer(Peer &p, size_t n)
{
  Buffers &b = BuffersFor(n);
  std::string ref;
  auto t0 = Clock::now();
  grpc::Status s = p.Put(b.src.data(), n, &ref);
  double tp = Since(t0);
  if (!s.ok())
    return "error put: " + s.error_message();
  b.back[n - 1] = 0;
  t0 = Clock::now();
  s = p.Get(ref, b.back.data(), n);
  double tg = Since(t0);
  if (!s.ok())
    return "error get: " + s.error_message();
  if (b.back[0] != 7 || b.back[n - 1] != 7)
    return "error get: wrong bytes";
  s = p.Free(ref);
  if (!s.ok())
    return "error free: " + s.error_message();
  char line[64];
  std::snprintf(line, sizeof line, "%.6f %.6f", tp, tg);
  return line;
}

} // namespace

int main(int argc, char **argv)
{
  std::string tcp, unix_addr;
  size_t chunk = (size_t)4 << 20;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--tcp") && i + 1 < argc)
      tcp = argv[++i];
    else if (!std::strcmp(argv[i], "--unix") && i + 1 < argc)
      unix_addr = argv[++i];
    else if (!std::strcmp(argv[i], "--chunk") && i + 1 < argc)
      chunk = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "tport-grpc-peer-client: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (tcp.empty() || chunk == 0 || chunk > (size_t)kMaxMessage - 4096) {
    std::fprintf(stderr, "tport-grpc-peer-client: needs --tcp and a --chunk under 64 MiB\n");
    return 2;
  }
  std::map<std::string, std::unique_ptr<Peer>> peers;
  peers["tcp"] = std::make_unique<Peer>(tcp, chunk);
  if (!unix_addr.empty())
    peers["ipc"] = std::make_unique<Peer>(unix_addr, chunk);
  for (auto &kv : peers) {
    Peer &p = *kv.second;
    if (!p.Connect()) {
      std::printf("error cannot connect over %s\n", kv.first.c_str());
      return 1;
    }
    std::string warm = Xfer(p, (size_t)1 << 20);
    const char four[4] = {1, 2, 3, 4};
    grpc::Status s = p.Put(four, sizeof four, &p.small_ref);
    for (int i = 0; s.ok() && i < 20; i++)
      s = p.Info(p.small_ref);
    if (warm.rfind("error", 0) == 0 || !s.ok()) {
      std::printf("error warm-up over %s: %s\n", kv.first.c_str(),
                  s.ok() ? warm.c_str() : s.error_message().c_str());
      return 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, t;
    size_t k = 0;
    in >> cmd >> t >> k;
    if (cmd == "quit")
      break;
    auto it = peers.find(t);
    if (it == peers.end() || k == 0) {
      std::printf("error bad command: %s\n", line.c_str());
    } else if (cmd == "xfer") {
      std::printf("%s\n", Xfer(*it->second, k).c_str());
    } else if (cmd == "info") {
      std::string out;
      for (size_t i = 0; i < k; i++) {
        auto t0 = Clock::now();
        grpc::Status s = it->second->Info(it->second->small_ref);
        double dt = Since(t0);
        if (!s.ok()) {
          out = "error info: " + s.error_message();
          break;
        }
        char v[32];
        std::snprintf(v, sizeof v, i ? " %.9f" : "%.9f", dt);
        out += v;
      }
      std::printf("%s\n", out.c_str());
    } else {
      std::printf("error bad command: %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
