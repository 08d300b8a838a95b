#include "runtime/net.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

namespace farmem {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

Result<addrinfo*> resolve(const Endpoint& ep, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string port = std::to_string(ep.port);
  int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0)
    return make_error(Errc::kInvalidArgument, "cannot resolve %s: %s", ep.to_string().c_str(),
                      gai_strerror(rc));
  return res;
}

Errc errno_to_errc(int e) {
  switch (e) {
    case EPIPE:
    case ECONNRESET:
    case ENOTCONN:
    case ECONNABORTED:
      return Errc::kUnavailable;
    case EAGAIN:
      return Errc::kTimeout;
    default:
      return Errc::kIo;
  }
}

}  // namespace

Result<Fd> tcp_listen(const Endpoint& ep, int backlog) {
  auto res = resolve(ep, true);
  if (!res.ok()) return res.status();
  Status last = make_error(Errc::kIo, "no usable address for %s", ep.to_string().c_str());
  for (addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = make_error(Errc::kIo, "socket: %s", strerror(errno));
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = make_error(Errc::kIo,
                        "cannot listen on %s: bind: %s (is another farmemd running there? pick "
                        "another --listen port)",
                        ep.to_string().c_str(), strerror(errno));
      continue;
    }
    if (listen(fd.get(), backlog) != 0) {
      last = make_error(Errc::kIo, "listen on %s: %s", ep.to_string().c_str(), strerror(errno));
      continue;
    }
    freeaddrinfo(*res);
    return fd;
  }
  freeaddrinfo(*res);
  return last;
}

Result<Fd> tcp_connect(const Endpoint& ep, int timeout_ms) {
  auto res = resolve(ep, false);
  if (!res.ok()) return res.status();
  Status last = make_error(Errc::kUnavailable, "no usable address for %s", ep.to_string().c_str());
  for (addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) continue;
    int rc = connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int pr;
      do pr = poll(&p, 1, timeout_ms);
      while (pr < 0 && errno == EINTR);
      if (pr == 0) {
        last = make_error(Errc::kTimeout, "connecting to %s timed out after %d ms",
                          ep.to_string().c_str(), timeout_ms);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last = make_error(Errc::kUnavailable, "cannot connect to %s: %s (is farmemd running there?)",
                        ep.to_string().c_str(), strerror(errno));
      continue;
    }
    int flags = fcntl(fd.get(), F_GETFL);
    fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    freeaddrinfo(*res);
    return fd;
  }
  freeaddrinfo(*res);
  return last;
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

Status set_socket_timeouts(int fd, int recv_ms, int send_ms) {
  timeval rt{recv_ms / 1000, (recv_ms % 1000) * 1000};
  timeval st{send_ms / 1000, (send_ms % 1000) * 1000};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &st, sizeof st) != 0)
    return make_error(Errc::kIo, "setsockopt timeouts: %s", strerror(errno));
  return ok_status();
}

Errc send_all(int fd, const void* data, size_t len) noexcept {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_to_errc(errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Errc::kOk;
}

Errc sendv_all(int fd, struct iovec* iov, int iovcnt) noexcept {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt > IOV_MAX ? IOV_MAX : iovcnt);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_to_errc(errno);
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return Errc::kOk;
}

Errc recv_all(int fd, void* data, size_t len) noexcept {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n == 0) return Errc::kUnavailable;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_to_errc(errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Errc::kOk;
}

}  // namespace farmem
