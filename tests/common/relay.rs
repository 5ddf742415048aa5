//! A TCP relay for one directed link between two nodes, which a test can cut
//! (drop live connections and refuse new ones) and heal.

use std::sync::Arc;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    pub port: u16,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target_port: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = watch::Sender::new(false);
        let rx = cut.subscribe();
        let task = tokio::spawn(accept(listener, target_port, Arc::new(rx)));
        Relay { port, cut, task }
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, target_port: u16, cut: Arc<watch::Receiver<bool>>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else { continue };
        if *cut.borrow() {
            continue; // dropped: the connection is reset
        }
        let mut cut = (*cut).clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target_port)).await else { return };
            tokio::select! {
                _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = cut.wait_for(|c| *c) => {}
            }
        });
    }
}
