//! The fault tier: the suites that need root and tools beyond the Rust
//! toolchain (network namespaces with `ip`, `nft` and `iptables`; FUSE for
//! power cuts; a tmpfs to fill; etcd, ZooKeeper and their clients), and the long
//! verification profiles. Built
//! only with the `faults` feature: `cargo test --features faults` runs both
//! tiers, as root. Here a missing privilege or tool fails the test; nothing
//! is skipped. `.ci/run` installs what they need and runs them.

mod console;
mod disk_full;
mod etcd;
mod lock_services;
mod memgrowth;
mod partitions;
mod power_loss;
mod soak;
mod torture;
mod zookeeper;
