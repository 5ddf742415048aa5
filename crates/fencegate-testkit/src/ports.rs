//! Loopback ports the OS assigns.
//!
//! Each port is held by a bound, non-listening socket for the life of the
//! node that uses it, so a parallel test is never handed it.

use std::time::Duration;

use tokio::time::Instant;

/// One port the OS had free.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct ports the OS had free: all are held open until every one is
/// chosen, so one call never returns the same port twice.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> = (0..N).map(|_| bind()).collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

fn bind() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap()
}

/// A loopback port reserved for a process the test starts, for as long as
/// this lives: a socket bound to it with `SO_REUSEADDR` that never listens.
/// The kernel hands the port to no other `bind(…:0)` (another test's node,
/// relay or upstream), so a node that was killed gets its own port back when
/// it restarts and a sidecar never reaches another test's node through it;
/// connecting while nothing listens is refused, as without the reservation;
/// and the process binds it itself (tokio and std set `SO_REUSEADDR` too).
pub struct Reserved {
    _socket: socket2::Socket,
    pub port: u16,
}

/// A free port, reserved until the value is dropped.
pub fn reserve() -> Reserved {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.set_reuse_address(true).unwrap();
    socket.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    Reserved { _socket: socket, port }
}

/// A port that accepts connections (the kernel completes the handshake) and
/// never answers: a lock service that is down but whose port nobody else can
/// take. Held until dropped.
pub struct BlackHole {
    listener: std::net::TcpListener,
}

impl BlackHole {
    pub fn new() -> BlackHole {
        BlackHole { listener: bind() }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.listener.local_addr().unwrap().port())
    }
}

impl Default for BlackHole {
    fn default() -> Self {
        Self::new()
    }
}

/// Until something accepts connections on 127.0.0.1:`port`, for `within` at most.
pub async fn wait_for_port(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listening on port {port} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kit relies on: a reserved port is never handed out by
    /// `bind(…:0)`, is refused while nothing listens, and can be bound (and
    /// served) explicitly by the process it is reserved for.
    #[test]
    fn a_reserved_port_is_not_handed_out_but_can_be_bound_by_its_process() {
        let r = reserve();
        // Taken, for a socket that does not share (what `bind(…:0)` looks for).
        let plain = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        assert!(plain.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], r.port)).into()).is_err());
        for _ in 0..2000 {
            assert_ne!(bind().local_addr().unwrap().port(), r.port);
        }
        assert!(std::net::TcpStream::connect(("127.0.0.1", r.port)).is_err());
        let listener = std::net::TcpListener::bind(("127.0.0.1", r.port)).unwrap();
        let client = std::net::TcpStream::connect(("127.0.0.1", r.port)).unwrap();
        assert_eq!(listener.accept().unwrap().0.peer_addr().unwrap(), client.local_addr().unwrap());
    }
}
