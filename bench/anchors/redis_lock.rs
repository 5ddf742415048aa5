//! Redis as a single-instance lock, the one an assistant hands you: acquire
//! is `SET key value NX PX ttl` with a random value of the holder's own,
//! release a compare-and-delete Lua script and keepalive a
//! compare-and-pexpire one (`EVALSHA`, `EVAL` on the first call). No
//! fencing token and no replication: the unsafe baseline, the throughput a
//! user gives up for safety.
//!
//! `redis-server` runs with its built-in defaults (no config file) but for
//! the port, the loopback address and a directory of its own: no AOF
//! (`appendonly no`), RDB snapshots after 3600 s/1 change, 300 s/100 or
//! 60 s/10,000 (a fork that writes `dump.rdb`), so an acknowledged lock is
//! in memory only, as a user running it so has it.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};
use fencegate_testkit::{free_port, Proc};
use redis::aio::MultiplexedConnection;
use redis::Script;
use tokio::time::timeout;

use crate::common::locks::{Backend, Held, LOAD_TIMEOUT, TTL};
use crate::common::wait_for_port;

pub struct RedisServer {
    pub url: String,
    proc: Proc,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let port = free_port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"]).arg(dir.path());
        let proc = Proc::spawn("redis", cmd, &dir.path().join("redis.log"));
        wait_for_port(port).await;
        RedisServer { url: format!("redis://127.0.0.1:{port}"), proc, _dir: dir }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// Delete the key only if it still holds the caller's value.
const RELEASE: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;
/// Extend the key's TTL (ARGV[2] ms) only if it still holds the caller's value.
const EXTEND: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) else return 0 end"#;

/// One multiplexed connection shared by all clients (redis-rs pipelines
/// their commands on it), as one process would use it.
#[derive(Clone)]
pub struct RedisApi {
    conn: MultiplexedConnection,
    release: Script,
    extend: Script,
}

impl RedisApi {
    pub async fn connect(url: &str) -> Result<RedisApi> {
        let conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
        Ok(RedisApi { conn, release: Script::new(RELEASE), extend: Script::new(EXTEND) })
    }
}

impl Backend for RedisApi {
    async fn acquire(&self, _url: &str, key: &str, ttl: Duration, within: Duration) -> Result<Held> {
        let value = format!("{:032x}", rand::random::<u128>());
        let mut set = redis::cmd("SET");
        set.arg(key).arg(&value).arg("NX").arg("PX").arg(ttl.as_millis() as u64);
        let answer: Option<String> = timeout(within, set.query_async(&mut self.conn.clone())).await??;
        if answer.is_none() {
            bail!("key {key} is held");
        }
        Ok(Held { token: None, lease: value, key: key.into() })
    }

    async fn release(&self, _url: &str, held: &Held) -> Result<()> {
        let mut call = self.release.key(&held.key);
        call.arg(&held.lease);
        let deleted: i64 = timeout(LOAD_TIMEOUT, call.invoke_async(&mut self.conn.clone())).await??;
        if deleted != 1 {
            bail!("{} was no longer ours", held.key);
        }
        Ok(())
    }

    async fn keepalive(&self, _url: &str, held: &Held) -> Result<()> {
        let mut call = self.extend.key(&held.key);
        call.arg(&held.lease).arg(TTL.as_millis() as u64);
        let extended: i64 = timeout(LOAD_TIMEOUT, call.invoke_async(&mut self.conn.clone())).await??;
        if extended != 1 {
            bail!("lease lost");
        }
        Ok(())
    }
}
