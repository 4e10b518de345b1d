//! Faults a local launch injects (`--fault "kill server:1 at 2s"`): which process, what is
//! done to it, and when.

use std::time::Duration;

/// The role a fault targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// Server N (0-based: the launch's servers in rank order, then the started ones).
    Server(usize),
    /// Worker N (0-based, in start order).
    Worker(usize),
    /// The coordinator.
    Coordinator,
    /// Every process of the job at once (a power cut): the launch ends, failed; the job can
    /// go on from its newest checkpoint with `--resume`.
    All,
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// SIGKILL the target's process.
    Kill(FaultTarget),
    /// Start one more server, which joins the running job (replicated jobs).
    StartServer,
    /// `admin drain` server N: its shards move away, then it exits (replicated jobs).
    Drain(usize),
    /// SIGKILL worker N and start no replacement: a live worker takes its share over
    /// (replicated jobs, after `--reassign-after-s`).
    Lose(usize),
}

/// A fault `launch --fault` injects at a time from the job's start.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    /// What happens.
    pub action: FaultAction,
    /// When, from the start of the launch.
    pub at: Duration,
}

/// Parses a time like `2s`, `1.5s` or `800ms`.
pub fn parse_time(t: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("time {t:?} needs a unit: 2s, 1.5s or 800ms"));
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale < 1e6 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!("time {t:?} is not a non-negative number of seconds or milliseconds")),
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// `kill server:N at TIME`, `kill worker:N at TIME`, `kill coordinator at TIME`,
    /// `kill all at TIME`, `lose worker:N at TIME`, `start server at TIME` or
    /// `drain server:N at TIME`.
    fn from_str(s: &str) -> Result<Fault, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let bad = || {
            format!(
                "fault {s:?}: expected `kill server:N at TIME`, `kill worker:N at TIME`, `kill coordinator at TIME`, \
                 `kill all at TIME`, `lose worker:N at TIME`, `start server at TIME` or `drain server:N at TIME`"
            )
        };
        let [action, target, at_word, time] = words[..] else { return Err(bad()) };
        if at_word != "at" {
            return Err(bad());
        }
        let index = |n: &str| n.parse::<usize>().map_err(|_| format!("fault {s:?}: {n:?} is not a process number"));
        let target_of = |t: &str| -> Result<FaultTarget, String> {
            match t.split_once(':') {
                Some(("server", n)) => Ok(FaultTarget::Server(index(n)?)),
                Some(("worker", n)) => Ok(FaultTarget::Worker(index(n)?)),
                None if t == "coordinator" => Ok(FaultTarget::Coordinator),
                None if t == "all" => Ok(FaultTarget::All),
                _ => Err(bad()),
            }
        };
        let action = match action {
            "kill" => FaultAction::Kill(target_of(target)?),
            "start" if target == "server" => FaultAction::StartServer,
            "lose" => match target_of(target)? {
                FaultTarget::Worker(n) => FaultAction::Lose(n),
                _ => return Err(format!("fault {s:?}: only a worker can be lost (its share goes to the others)")),
            },
            "drain" => match target_of(target)? {
                FaultTarget::Server(n) => FaultAction::Drain(n),
                _ => return Err(format!("fault {s:?}: only a server can be drained")),
            },
            _ => return Err(bad()),
        };
        Ok(Fault { action, at: parse_time(time).map_err(|e| format!("fault {s:?}: {e}"))? })
    }
}

impl std::fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultTarget::Server(n) => write!(f, "server {n}"),
            FaultTarget::Worker(n) => write!(f, "worker {n}"),
            FaultTarget::Coordinator => write!(f, "coordinator"),
            FaultTarget::All => write!(f, "every process"),
        }
    }
}

impl std::fmt::Display for FaultAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultAction::Kill(t) => write!(f, "kill {t}"),
            FaultAction::StartServer => write!(f, "start a server"),
            FaultAction::Drain(n) => write!(f, "drain server {n}"),
            FaultAction::Lose(n) => write!(f, "lose worker {n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_the_documented_forms_and_refuse_others() {
        let f: Fault = "kill server:1 at 3s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::Server(1)), at: Duration::from_secs(3) });
        let f: Fault = "kill worker:0 at 1.5s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::Worker(0)), at: Duration::from_millis(1500) });
        let f: Fault = " kill  coordinator at 800ms ".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::Coordinator), at: Duration::from_millis(800) });
        let f: Fault = "lose worker:1 at 2s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Lose(1), at: Duration::from_secs(2) });
        assert!("lose server:1 at 2s".parse::<Fault>().is_err());
        let f: Fault = "kill all at 2s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::All), at: Duration::from_secs(2) });
        let f: Fault = "start server at 6s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::StartServer, at: Duration::from_secs(6) });
        let f: Fault = "drain server:2 at 4s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Drain(2), at: Duration::from_secs(4) });
        for bad in [
            "kill server:x at 1s",
            "kill server:1 at 1",
            "kill server:1 at -1s",
            "stop server:1 at 1s",
            "kill server:1",
            "kill disk:1 at 1s",
            "start worker at 1s",
            "start server:1 at 1s",
            "drain worker:0 at 1s",
            "drain coordinator at 1s",
            "",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad:?} parsed");
        }
    }
}
