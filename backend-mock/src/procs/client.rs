//! A rank's connection to the hub (every rank but 0): its requests, and a watch on the
//! hub's life.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use unicomm_core::{Error, Result};

use super::wire::*;

pub(crate) struct Client {
    addr: SocketAddr,
    secret: [u8; 32],
    pub(crate) rank: usize,
    /// The world size this rank was told (its hello carries it: rank 0 refuses another).
    world: usize,
    pool: Mutex<Vec<TcpStream>>,
    pub(crate) poison: Arc<Mutex<Option<Error>>>,
    life: Mutex<Option<TcpStream>>,
    departing: Arc<AtomicBool>,
}

impl Client {
    pub(crate) fn connect(
        id: &HubId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Arc<Client>> {
        let c = Client {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, id.port)),
            secret: id.secret,
            rank,
            world,
            pool: Mutex::new(Vec::new()),
            poison: Arc::new(Mutex::new(None)),
            life: Mutex::new(None),
            departing: Arc::new(AtomicBool::new(false)),
        };
        let s = c.open(LIFE, timeout)?;
        let reader = s.try_clone().map_err(|e| Error::Bootstrap {
            reason: format!("the mock's hub connection: {e}"),
        })?;
        *c.life.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        let (poison, departing) = (c.poison.clone(), c.departing.clone());
        std::thread::Builder::new()
            .name("unicomm-mock-life".into())
            .spawn(move || watch_hub(reader, poison, departing))
            .map_err(|e| Error::Bootstrap {
                reason: format!("the mock's hub watcher: {e}"),
            })?;
        Ok(Arc::new(c))
    }

    /// A new authenticated connection of `kind`: the hello, then the hub's acknowledgement.
    /// A connection the hub closed unacknowledged (it was full of strangers' connections,
    /// each bounded in time) is retried until `timeout`.
    fn open(&self, kind: u8, timeout: Duration) -> Result<TcpStream> {
        let deadline = std::time::Instant::now() + timeout.min(Duration::from_secs(30));
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut s = TcpStream::connect_timeout(&self.addr, left.max(Duration::from_millis(1)))
                .map_err(|e| {
                    Error::lost(
                        vec![0],
                        format!(
                            "rank {}: cannot reach the mock's hub (rank 0's process) at {}: {e}",
                            self.rank, self.addr
                        ),
                    )
                })?;
            let _ = s.set_nodelay(true);
            let mut w = W::default();
            w.0.extend_from_slice(&self.secret);
            w.u64(self.rank as u64).u8(kind).u64(self.world as u64);
            // A hello the hub does not take (a secret that is not its own) ends with the
            // connection closed unacknowledged, before or after the hello is sent: the
            // same as a hub busy with strangers, retried, and named as either at the end;
            // never the hub's loss (which poisons the world).
            let answer = send_frame(&mut s, &w.0)
                .map_err(|e| e.to_string())
                .and_then(|()| recv_frame_within(&mut s, 16, deadline).map_err(|e| e.to_string()));
            match answer {
                Ok(ack) if ack == [0] => {
                    let _ = s.set_read_timeout(None);
                    return Ok(s);
                }
                // Refused by the hub after the secret was proven: at once, naming why.
                Ok(no) => return Err(Refusal::error(&no, self.rank, self.world)),
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(Error::Bootstrap {
                        reason: format!(
                            "rank {}: the mock's hub at {} closed this rank's connections unacknowledged until the deadline: the unique id's secret is not this hub's (an id of another job or run), or the hub was busy with strangers' connections ({e})",
                            self.rank, self.addr
                        ),
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn lost(&self, e: std::io::Error) -> Error {
        let err = Error::lost(vec![0], format!(
                "rank {}: the connection to the mock's hub (rank 0's process) failed: {e}; rank 0's process exited",
                self.rank
            ));
        self.poison
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(err.clone());
        err
    }

    /// One request and its reply; `wait` is how long the hub may take.
    pub(crate) fn call(&self, req: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut s = match pooled {
            Some(s) => s,
            None => self.open(CALLS, wait)?,
        };
        let _ = s.set_read_timeout(Some(wait + SLACK));
        send_frame(&mut s, req).map_err(|e| self.lost(e))?;
        let reply = match recv_frame(&mut s) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Timeout {
                    what: format!("rank {}: the mock's hub did not answer", self.rank),
                    after: wait + SLACK,
                })
            }
            Err(e) => return Err(self.lost(e)),
        };
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        Ok(reply)
    }

    pub(crate) fn call_result(&self, req: &W, wait: Duration) -> Result<()> {
        let reply = self.call(&req.0, wait)?;
        R(&reply).result()?
    }

    /// Tells the hub this rank finalized (its connections closing next is no failure).
    pub(crate) fn bye(&self) {
        self.departing.store(true, Ordering::Relaxed);
        if let Some(s) = self.life.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = s.write_all(&[op::BYE]);
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(s) = self.life.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn watch_hub(mut s: TcpStream, poison: Arc<Mutex<Option<Error>>>, departing: Arc<AtomicBool>) {
    let _ = s.set_read_timeout(None);
    let e = match recv_frame(&mut s) {
        Ok(frame) => R(&frame).error().unwrap_or_else(|e| e),
        Err(_) if departing.load(Ordering::Relaxed) => return,
        Err(e) => Error::lost(vec![0], format!(
                "the mock's hub (rank 0's process) closed the connection ({e}): rank 0's process exited"
            )),
    };
    poison
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(e);
}

// ---------------------------------------------------------------------------------------
// The fabric of a rank in a multi-process world.
