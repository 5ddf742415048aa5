//! Shared by the benchmarks: processes on loopback killed when dropped, what
//! they cost (/proc), load generators, and result files.
#![allow(dead_code)] // each benchmark uses a part

pub mod cluster;
pub mod etcd;
pub mod load;
pub mod procs;
pub mod report;
pub mod sidecar;
pub mod upstream;

/// `N` distinct free ports (all held until every one is chosen).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> =
        (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// A numeric setting from the environment, or its default.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}
