//! Loopback ports the OS assigns.

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
