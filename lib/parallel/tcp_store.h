// TCP rendezvous and socket I/O for runs without MPI (torchrun): rank 0 listens, every other rank connects to it
// and says who it is, and the sockets stay open for the collectives (comm_tcp.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gt {

/// gputrain listens on MASTER_PORT + this: torchrun's agent already holds MASTER_PORT for its own TCPStore
/// (TORCHELASTIC_USE_AGENT_STORE), so the next port is the one gputrain's rank 0 binds.
constexpr int kTcpPortOffset = 1;

enum class TcpIo { ok, timed_out, closed };

/// Sends or receives exactly `bytes` on a connected socket. `timed_out`: no byte moved for `timeout_s` (the peer is
/// stopped or unreachable); `closed`: the peer closed the connection or it broke (the peer ended).
TcpIo tcp_send(int fd, const void* data, size_t bytes, double timeout_s);
TcpIo tcp_recv(int fd, void* data, size_t bytes, double timeout_s);

/// Connects the `world` ranks: rank 0 listens on `port` (every interface) and accepts one connection from each
/// other rank; the others connect to `addr`:`port`, retrying until rank 0 listens. The whole rendezvous must finish
/// within `timeout_s`. Returns the sockets, indexed by rank: rank 0 gets one per other rank (entry 0 is -1), the
/// others get one to rank 0 at entry 0 (and -1 elsewhere). Throws gt::Error (exit 3) naming the ranks that did not
/// arrive, a port already in use, or ranks that disagree on the world size.
std::vector<int> tcp_rendezvous(const std::string& addr, int port, int rank, int world, double timeout_s);

/// Closes every socket of a rendezvous (the peers see the connection end at once).
void tcp_close_all(std::vector<int>& fds);

}  // namespace gt
