// Small socket helpers shared by farmemd and the client side.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "runtime/parse.h"
#include "runtime/status.h"

namespace farmem {

// Owning file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Listening TCP socket with SO_REUSEADDR. Port 0 picks a free port.
Result<Fd> tcp_listen(const Endpoint& ep, int backlog = 512);
// Connected TCP socket with TCP_NODELAY, within timeout_ms.
Result<Fd> tcp_connect(const Endpoint& ep, int timeout_ms = 5000);
// The port a bound socket listens on.
uint16_t local_port(int fd);

// SO_RCVTIMEO / SO_SNDTIMEO in milliseconds (0: none).
Status set_socket_timeouts(int fd, int recv_ms, int send_ms);

// Blocking whole transfers, retrying on EINTR and short counts.
// kUnavailable: the peer closed or reset; kTimeout: a socket timeout hit;
// kIo: any other failure.
Errc send_all(int fd, const void* data, size_t len) noexcept;
Errc sendv_all(int fd, struct iovec* iov, int iovcnt) noexcept;  // modifies iov
Errc recv_all(int fd, void* data, size_t len) noexcept;

}  // namespace farmem
