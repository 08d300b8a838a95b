// An in-process donor for tests and benchmarks: a DonorServer (the code
// farmemd runs) listening on an ephemeral port, and one DonorSession
// connected to it with the donor's token.
//
//   auto d = LocalDonor::start(local_donor_options("my-test-token"));
//   ASSERT_TRUE(d.ok()) << d.status().to_string();
//   TcpTransport t;
//   ASSERT_TRUE(t.add_server(0, (*d)->session()).ok());
//   DonorSessionSlabSource src(0, (*d)->session());
//   ...                     // destroy t and src before *d
//
// Needs farmem::donor (the daemon's library) linked. Header-only, so that
// tests/ and bench/ targets can include it without a library of their own.
#pragma once

#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/status.h"

namespace farmem::testing {

// 127.0.0.1:0, a token, no huge pages (tests must not depend on the host's
// hugepage pool).
// Whether this process may use process_vm_readv at all (a sandbox's
// seccomp profile may forbid it): "Local donors" then stays on tcp, and
// the tests that expect the one-sided path skip.
// read_own_memory: n bytes at addr of this process, read as another
// process would (process_vm_readv); 0, or the errno (EFAULT: nothing
// mapped there).
inline int read_own_memory(uint64_t addr, void* out, size_t n) {
  iovec l{out, n}, r{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == static_cast<ssize_t>(n) ? 0 : errno;
}
inline bool one_sided_allowed() {
  int probe = 1, got = 0;
  return read_own_memory(reinterpret_cast<uint64_t>(&probe), &got, sizeof got) == 0;
}
// take_fd: another process's descriptor `fd` (here: this process's), as a
// local client takes a slab's file (pidfd_getfd); -1 when not allowed.
inline int take_fd(int fd) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (pidfd < 0) return -1;
  const int got = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  close(pidfd);
  return got;
}
// Whether the file path of "Local donors" is open to this process (a
// seccomp profile may forbid pidfd_getfd): its tests skip otherwise.
inline bool take_fd_allowed() {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (pidfd < 0) return false;
  const int got = take_fd(pidfd);
  close(pidfd);
  if (got >= 0) close(got);
  return got >= 0;
}

// local_clients: DonorOptions::local_clients (one-sided access for this
// process, tcp_transport.cc "Local donors"); off keeps every op on the wire.
inline DonorOptions local_donor_options(std::string token, uint64_t capacity = 64ull << 20,
                                        uint64_t slab_size = 1ull << 20,
                                        bool local_clients = false) {
  DonorOptions o;
  o.local_clients = local_clients;
  o.listen = {"127.0.0.1", 0};
  o.capacity = capacity;
  o.slab_size = slab_size;
  o.token = std::move(token);
  o.try_hugepages = false;
  return o;
}

class LocalDonor {
 public:
  // Starts the server with `o` and connects a session to the port it got
  // (o.listen's host, o.token). io_timeout_ms > 0 overrides the session's
  // control round-trip limit. The error says which of the two steps failed.
  static Result<std::unique_ptr<LocalDonor>> start(const DonorOptions& o, int io_timeout_ms = 0) {
    auto srv = DonorServer::start(o);
    if (!srv.ok())
      return make_error(srv.status().code(), "local donor: server did not start: %s",
                        srv.status().to_string().c_str());
    std::unique_ptr<LocalDonor> d(new LocalDonor());
    d->server_ = std::move(*srv);
    DonorClientOptions co;
    co.server = {o.listen.host, d->server_->port()};
    co.token = o.token;
    if (io_timeout_ms > 0) co.io_timeout_ms = io_timeout_ms;
    auto session = DonorSession::connect(co);
    if (!session.ok())
      return make_error(session.status().code(), "local donor: session to %s failed: %s",
                        co.server.to_string().c_str(), session.status().to_string().c_str());
    d->session_ = std::move(*session);
    return d;
  }

  // The session goes first: it talks to the server.
  ~LocalDonor() {
    session_.reset();
    if (server_) server_->stop();
  }
  LocalDonor(const LocalDonor&) = delete;
  LocalDonor& operator=(const LocalDonor&) = delete;

  DonorServer& server() { return *server_; }
  DonorSession* session() { return session_.get(); }
  uint16_t port() const { return server_->port(); }
  // Stops serving (a donor lost); the session object stays for its users.
  void stop_server() { server_->stop(); }

 private:
  LocalDonor() = default;
  std::unique_ptr<DonorServer> server_;
  std::unique_ptr<DonorSession> session_;
};

}  // namespace farmem::testing
