//! `downpour top`: a live view of servers' metrics endpoints (`server --metrics-listen`) in
//! the terminal: per server its epoch, memory and request latency, per table its rows,
//! bytes and rates (keys pushed and pulled, rows admitted and evicted per second).

use anyhow::{bail, Context, Result};
use prometheus_parse::{Sample, Scrape, Value};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// Flags of `downpour top`.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// The servers' metrics endpoints (`server --metrics-listen`, `launch --metrics-port`),
    /// comma-separated HOST:PORT.
    #[arg(long, value_delimiter = ',', required_unless_present = "coordinator", conflicts_with = "coordinator", value_name = "ADDR,...")]
    pub metrics: Vec<String>,
    /// The job's coordinator: view every server that registered a metrics endpoint
    /// (`server --metrics-listen`), as the routing stands at the start.
    #[arg(long, value_name = "ADDR")]
    pub coordinator: Option<String>,
    /// Seconds between refreshes (rates are over this interval).
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Print one view (two scrapes one interval apart, for the rates) and exit.
    #[arg(long)]
    pub once: bool,
}

/// One server's scrape, or why there is none.
struct Reading {
    at: Instant,
    scrape: std::result::Result<Scrape, String>,
}

/// GET `/metrics` from `addr`, parsed.
fn fetch(addr: &str) -> Result<Scrape> {
    use std::net::ToSocketAddrs;
    let to = addr.to_socket_addrs().with_context(|| format!("{addr}: not an address"))?.next();
    let to = to.with_context(|| format!("{addr}: no address"))?;
    let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)).with_context(|| format!("cannot reach {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).with_context(|| format!("reading {addr}"))?;
    let Some((head, body)) = reply.split_once("\r\n\r\n") else { bail!("{addr}: not an HTTP reply") };
    if !head.lines().next().is_some_and(|l| l.contains(" 200 ")) {
        bail!("{addr}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?)
}

fn scalar(v: &Value) -> f64 {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
        _ => f64::NAN,
    }
}

/// The samples of `metric` with label `k` = `v` (every sample when `k` is empty).
fn find<'a>(s: &'a Scrape, metric: &'a str, want: &'a [(&'a str, &'a str)]) -> impl Iterator<Item = &'a Sample> + 'a {
    s.samples.iter().filter(move |x| x.metric == metric && want.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
}

fn get(s: &Scrape, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    find(s, metric, want).next().map(|x| scalar(&x.value))
}

/// The per-second rate of `metric` between two scrapes `secs` apart.
fn rate(now: &Scrape, before: Option<&Scrape>, secs: f64, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    let (a, b) = (get(now, metric, want)?, get(before?, metric, want)?);
    Some(((a - b) / secs).max(0.0))
}

/// The q-quantile's bucket bound of `op`'s request latency between two scrapes, µs.
fn quantile(now: &Scrape, before: Option<&Scrape>, op: &str, q: f64) -> Option<f64> {
    let buckets = |s: &Scrape| -> Option<Vec<(f64, f64)>> {
        match &find(s, "downpour_request_seconds", &[("op", op)]).next()?.value {
            Value::Histogram(h) => Some(h.iter().map(|c| (c.less_than, c.count)).collect()),
            _ => None,
        }
    };
    let a = buckets(now)?;
    let b = before.and_then(buckets).unwrap_or_else(|| a.iter().map(|&(le, _)| (le, 0.0)).collect());
    let d: Vec<(f64, f64)> = a.iter().zip(&b).map(|(&(le, x), &(_, y))| (le, x - y)).collect();
    let total = d.last()?.1;
    if total <= 0.0 {
        return None;
    }
    d.iter().find(|&&(_, c)| c >= q * total).map(|&(le, _)| le * 1e6)
}

fn si(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(x) if x >= 1e9 => format!("{:.1}G", x / 1e9),
        Some(x) if x >= 1e6 => format!("{:.1}M", x / 1e6),
        Some(x) if x >= 1e3 => format!("{:.1}k", x / 1e3),
        Some(x) => format!("{x:.0}"),
    }
}

fn mib(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.1}", x / (1u64 << 20) as f64))
}

fn us(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(x) if x.is_infinite() => ">1s".into(),
        Some(x) => format!("{x:.0}"),
    }
}

/// The view of every server: `now[i]` and `before[i]` are scrapes of `addrs[i]`.
fn view(addrs: &[String], now: &[Reading], before: Option<&[Reading]>) -> String {
    let mut out = String::new();
    for (i, addr) in addrs.iter().enumerate() {
        let s = match &now[i].scrape {
            Ok(s) => s,
            Err(e) => {
                out.push_str(&format!("{addr}: {e}\n\n"));
                continue;
            }
        };
        let prev = before.and_then(|b| b[i].scrape.as_ref().ok());
        let secs = before.map_or(1.0, |b| now[i].at.duration_since(b[i].at).as_secs_f64().max(1e-3));
        let who = find(s, "downpour_server", &[])
            .next()
            .map(|x| format!("node {} rank {}", x.labels.get("node").unwrap_or("?"), x.labels.get("rank").unwrap_or("?")))
            .unwrap_or_default();
        out.push_str(&format!(
            "{addr} ({who}, epoch {}): tables {} MiB (peak {}), peak RSS {} MiB; frame latency p50/p99 µs: push {}/{}, pull {}/{}\n",
            get(s, "downpour_routing_epoch", &[]).map_or("-".into(), |e| format!("{e:.0}")),
            mib(get(s, "downpour_tables_bytes", &[])),
            mib(get(s, "downpour_tables_peak_bytes", &[])),
            mib(get(s, "downpour_process_peak_rss_bytes", &[])),
            us(quantile(s, prev, "push", 0.5)),
            us(quantile(s, prev, "push", 0.99)),
            us(quantile(s, prev, "pull", 0.5)),
            us(quantile(s, prev, "pull", 0.99)),
        ));
        out.push_str(&format!(
            "  {:<6} {:<16} {:>9} {:>9} {:>12} {:>12} {:>11} {:>11}\n",
            "table", "name", "rows", "MiB", "push keys/s", "pull keys/s", "admitted/s", "evicted/s"
        ));
        let tables: BTreeMap<u32, String> = find(s, "downpour_table_rows", &[])
            .filter_map(|x| Some((x.labels.get("table")?.parse().ok()?, x.labels.get("name").unwrap_or("").to_string())))
            .collect();
        for (id, name) in tables {
            let id = id.to_string();
            let t = [("table", id.as_str())];
            let op = |o: &'static str| [("table", id.as_str()), ("op", o)];
            out.push_str(&format!(
                "  {:<6} {:<16} {:>9} {:>9} {:>12} {:>12} {:>11} {:>11}\n",
                id,
                name,
                si(get(s, "downpour_table_rows", &t)),
                mib(get(s, "downpour_table_bytes", &t)),
                si(rate(s, prev, secs, "downpour_table_keys_total", &op("push"))),
                si(rate(s, prev, secs, "downpour_table_keys_total", &op("pull"))),
                si(rate(s, prev, secs, "downpour_table_admitted_keys_total", &t)),
                si(rate(s, prev, secs, "downpour_table_evicted_rows_total", &t)),
            ));
        }
        out.push('\n');
    }
    out
}

fn read_all(addrs: &[String]) -> Vec<Reading> {
    addrs.iter().map(|a| Reading { at: Instant::now(), scrape: fetch(a).map_err(|e| format!("{e:#}")) }).collect()
}

/// The metrics endpoints of the servers of the job whose coordinator is at `coordinator`.
fn endpoints_of(coordinator: &str, s: &downpour_cluster::Settings) -> Result<Vec<String>> {
    let t = downpour_transport::network_transport(s.transport, s.net_config())?;
    let mut c = downpour_coordinator::client::ControlClient::connect(t.as_ref(), coordinator, s.connect_timeout)
        .with_context(|| format!("cannot reach the coordinator at {coordinator}"))?;
    c.set_timeout(Some(s.connect_timeout))?;
    let routing = c.routing(0, s.connect_timeout).context("asking the coordinator for the routing")?;
    let addrs: Vec<String> = routing.servers.iter().map(|e| e.metrics_addr.clone()).filter(|a| !a.is_empty()).collect();
    if addrs.is_empty() {
        bail!(
            "none of the job's {} servers serves metrics: start them with --metrics-listen ADDR (launch --metrics-port PORT)",
            routing.servers.len()
        );
    }
    Ok(addrs)
}

/// Runs `downpour top`: refreshes until interrupted, or prints one view with `--once`.
pub fn run(mut a: TopArgs, s: &downpour_cluster::Settings) -> Result<()> {
    anyhow::ensure!(a.interval.is_finite() && a.interval >= 0.05, "--interval must be at least 0.05 seconds");
    if let Some(c) = &a.coordinator {
        a.metrics = endpoints_of(c, s)?;
    }
    let every = Duration::from_secs_f64(a.interval);
    let mut before = read_all(&a.metrics);
    if a.once && before.iter().all(|r| r.scrape.is_err()) {
        bail!("no server answered: {}", before.iter().filter_map(|r| r.scrape.as_ref().err().cloned()).collect::<Vec<_>>().join("; "));
    }
    let tty = std::io::stdout().is_terminal();
    loop {
        std::thread::sleep(every);
        let now = read_all(&a.metrics);
        let v = view(&a.metrics, &now, Some(&before));
        if a.once {
            print!("{v}");
            return Ok(());
        }
        if tty {
            // clear the screen, cursor home
            print!("\x1b[2J\x1b[H");
        }
        print!("{v}");
        std::io::stdout().flush()?;
        before = now;
    }
}
