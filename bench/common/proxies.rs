//! The reverse proxies the sidecar is compared with, nginx and HAProxy, in
//! front of one upstream, configured as one would for this job. The program
//! to run is a parameter: the proxy itself, or a script that runs it under a
//! tool (`callgrind::wrapper`).

use std::path::Path;
use std::process::Command;

use fencegate_testkit::Proc;

/// How many nginx processes serve.
#[derive(Debug, Clone, Copy)]
pub enum NginxProcesses {
    /// A master and this many workers, as deployed.
    Workers(usize),
    /// One process, no master: it serves itself, so a tool that wraps the
    /// program sees the process that does the work.
    Single,
}

/// nginx (`program`: `nginx` or a wrapper of it) on `port` in front of the
/// upstream on `up`, its files in `dir`.
pub fn nginx(dir: &Path, program: &Path, port: u16, up: u16, processes: NginxProcesses) -> Proc {
    let processes = match processes {
        NginxProcesses::Workers(n) => format!("master_process on;\nworker_processes {n};\n"),
        NginxProcesses::Single => "master_process off;\nworker_processes 1;\n".into(),
    };
    // Upstream keep-alive, access log off: how one would tune it for this
    // job. X-Forwarded-For as the sidecar sets it.
    let conf = format!(
        "daemon off;\n{processes}pid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  client_body_temp_path {d}/nginx-body;\n  proxy_temp_path {d}/nginx-proxy;\n\
         upstream up {{ server 127.0.0.1:{up}; keepalive 64; keepalive_requests 1000000; }}\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://up;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n    }}\n  }}\n}}\n",
        d = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let mut cmd = Command::new(program);
    cmd.arg("-c").arg(&path).arg("-p").arg(dir);
    Proc::spawn("nginx", cmd, &dir.join("nginx.log"))
}

/// HAProxy (`program`: `haproxy` or a wrapper of it) with `threads` threads
/// on `port` in front of the upstream on `up`, its files in `dir`.
pub fn haproxy(dir: &Path, program: &Path, port: u16, up: u16, threads: usize) -> Proc {
    let conf = format!(
        "global\n  nbthread {threads}\n  maxconn 4096\n\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n\
         timeout server 30s\n  option forwardfor\n  http-reuse always\n\n\
         frontend front\n  bind 127.0.0.1:{port}\n  default_backend up\n\n\
         backend up\n  server s1 127.0.0.1:{up}\n"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, conf).unwrap();
    let mut cmd = Command::new(program);
    cmd.arg("-db").arg("-f").arg(&path);
    Proc::spawn("haproxy", cmd, &dir.join("haproxy.log"))
}
