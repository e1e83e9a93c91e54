// TCP rendezvous: a hello of magic, rank and world size from each rank to rank 0, and rank 0's answer once every rank
// has arrived, so that no rank starts a collective while another is still missing.
#include "parallel/tcp_store.h"

#include "core/error.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

namespace gt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x47545256;  // "GTRV"

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t world;
};

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

int poll_ms(double seconds) { return seconds <= 0 ? 0 : static_cast<int>(std::min(seconds * 1000.0, 1e9)) + 1; }

// Waits until `fd` is ready for `events`; false when `timeout_s` passed first.
bool wait_ready(int fd, short events, double timeout_s) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_ms(seconds_left(deadline)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // the next send/recv reports the error
    if (r == 0 && seconds_left(deadline) <= 0) return false;
  }
}

void set_options(int fd) {
  const int one = 1;
  // Collectives send one buffer and wait for the answer: Nagle's delay would add up to 40 ms per step.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

std::string errno_text() { return std::strerror(errno); }

// A TCP socket of `family` (SO_REUSEADDR; an IPv6 one takes IPv4 too) bound to `addr`; -1 with errno saying why
// when it cannot be made or bound.
int bound_socket(int family, const void* addr, socklen_t addr_len) {
  const int one = 1, zero = 0;
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  if (::bind(fd, static_cast<const sockaddr*>(addr), addr_len) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Rank 0's listening socket on every interface: IPv6 with IPv4 mapped when the host has IPv6, IPv4 otherwise.
int listen_on(int port, int backlog) {
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_any;
  a6.sin6_port = htons(static_cast<uint16_t>(port));
  int fd = bound_socket(AF_INET6, &a6, sizeof a6);
  if (fd < 0 && errno != EADDRINUSE) {
    sockaddr_in a4{};
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons(static_cast<uint16_t>(port));
    fd = bound_socket(AF_INET, &a4, sizeof a4);
  }
  if (fd < 0)
    throw Error(ErrorKind::distributed,
                fmt::format("rank 0: cannot listen on TCP port {} (MASTER_PORT + {}): {}; choose another "
                            "--master_port",
                            port, kTcpPortOffset, errno_text()));
  if (::listen(fd, backlog) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw Error(ErrorKind::distributed, fmt::format("rank 0: cannot listen on TCP port {}: {}", port, why));
  }
  set_options(fd);
  return fd;
}

std::vector<int> accept_ranks(int port, int world, double timeout_s) {
  const int listener = listen_on(port, world * 2);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::vector<int> fds(static_cast<size_t>(world), -1);
  auto give_up = [&](const std::string& message) {
    ::close(listener);
    tcp_close_all(fds);
    throw Error(ErrorKind::distributed, message);
  };
  int joined = 1;
  while (joined < world) {
    if (!wait_ready(listener, POLLIN, seconds_left(deadline))) {
      std::string missing;
      for (int r = 1; r < world; ++r)
        if (fds[static_cast<size_t>(r)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      give_up(
          fmt::format("rank 0: rank(s) {} did not connect to TCP port {} within {:.0f} s (dist.timeout_s): "
                      "did they start, and can they reach this host?",
                      missing, port, timeout_s));
    }
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up in between
    set_options(fd);
    Hello h{};
    // A connection that does not speak the protocol (a port scanner, a stale rank of an earlier run) is dropped;
    // the ranks that belong here still get the rest of the time.
    if (tcp_recv(fd, &h, sizeof h, std::max(0.1, std::min(5.0, seconds_left(deadline)))) != TcpIo::ok ||
        h.magic != kMagic) {
      ::close(fd);
      continue;
    }
    if (h.world != world) {
      ::close(fd);
      give_up(
          fmt::format("rank 0: rank {} says the world has {} ranks, this rank says {}: were they started by "
                      "the same launch?",
                      h.rank, h.world, world));
    }
    if (h.rank <= 0 || h.rank >= world || fds[static_cast<size_t>(h.rank)] >= 0) {
      ::close(fd);
      give_up(fmt::format("rank 0: a second process says it is rank {} of {}: two launches share TCP port {}", h.rank,
                          world, port));
    }
    fds[static_cast<size_t>(h.rank)] = fd;
    ++joined;
  }
  ::close(listener);
  const Hello all{kMagic, 0, world};
  for (int r = 1; r < world; ++r)
    if (tcp_send(fds[static_cast<size_t>(r)], &all, sizeof all, std::max(1.0, seconds_left(deadline))) != TcpIo::ok)
      give_up(fmt::format("rank 0: rank {} left during the rendezvous", r));
  return fds;
}

// One connection attempt to addr:port; -1 when nothing listens there yet.
int try_connect(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &found);
  if (rc != 0)
    throw Error(ErrorKind::distributed, fmt::format("MASTER_ADDR={} cannot be resolved: {}", addr, ::gai_strerror(rc)));
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  return fd;
}

int connect_to_rank0(const std::string& addr, int port, int rank, int world, double timeout_s) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    const int fd = try_connect(addr, port);
    if (fd >= 0) {
      set_options(fd);
      const Hello mine{kMagic, rank, world};
      Hello all{};
      // A connection that rank 0 drops (it is still setting up, or this was another program's port) is retried.
      if (tcp_send(fd, &mine, sizeof mine, std::max(0.1, seconds_left(deadline))) == TcpIo::ok &&
          tcp_recv(fd, &all, sizeof all, std::max(0.1, seconds_left(deadline))) == TcpIo::ok && all.magic == kMagic &&
          all.world == world)
        return fd;
      ::close(fd);
    }
    if (seconds_left(deadline) <= 0)
      throw Error(ErrorKind::distributed,
                  fmt::format("rank {}: rank 0 did not answer at {}:{} (MASTER_ADDR:MASTER_PORT + {}) within {:.0f} s "
                              "(dist.timeout_s)",
                              rank, addr, port, kTcpPortOffset, timeout_s));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

TcpIo tcp_send(int fd, const void* data, size_t bytes, double timeout_s) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, timeout_s)) return TcpIo::timed_out;
      continue;
    }
    return TcpIo::closed;
  }
  return TcpIo::ok;
}

TcpIo tcp_recv(int fd, void* data, size_t bytes, double timeout_s) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return TcpIo::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, timeout_s)) return TcpIo::timed_out;
      continue;
    }
    return TcpIo::closed;
  }
  return TcpIo::ok;
}

std::vector<int> tcp_rendezvous(const std::string& addr, int port, int rank, int world, double timeout_s) {
  if (port <= 0 || port > 65535)
    throw Error(ErrorKind::distributed,
                fmt::format("TCP port {} is out of range (MASTER_PORT + {})", port, kTcpPortOffset));
  if (rank == 0) return accept_ranks(port, world, timeout_s);
  std::vector<int> fds(static_cast<size_t>(world), -1);
  fds[0] = connect_to_rank0(addr, port, rank, world, timeout_s);
  return fds;
}

void tcp_close_all(std::vector<int>& fds) {
  for (int& fd : fds) {
    if (fd < 0) continue;
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    fd = -1;
  }
}

}  // namespace gt
