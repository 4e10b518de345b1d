#!/usr/bin/env python3
"""Times of worker replacement and coordinator restart, from the processes' logs.

Usage (after cargo build --release): scripts/role_restart_times.py worker|coordinator
10 runs of `downpour launch --servers 3 --workers 2 --replication 2 --fault "kill worker:W at T"`
(or "kill coordinator at T") -- counter --keys 100000 --rounds 300, T from the run number.
Prints per run: (run, fault, exit code, exact workers,
  worker:      ms from the kill (the servers' first closed connection) to the coordinator noticing
               the loss, ms from that to the replacement taking the rank;
  coordinator: ms from the nodes noticing the loss to the restarted coordinator taking the job
               back, ms from that to the last node's first answer after reconnecting
               (a heartbeat, long-polled: it includes up to one heartbeat interval)).
"""
import subprocess, re, sys, datetime
def ts(line):
    m = re.search(r'(\d\d:\d\d:\d\d\.\d+)Z', line)
    if not m: return None
    h,mi,s = m.group(1).split(':')
    return int(h)*3600+int(mi)*60+float(s)
mode = sys.argv[1]
res=[]
for seed in range(1, 11):
    t = 500 + (seed*7919) % 2500
    fault = f"kill worker:{seed%2} at {t}ms" if mode=='worker' else f"kill coordinator at {t}ms"
    p = subprocess.run(["target/release/downpour","launch","--servers","3","--workers","2","--replication","2","--fault",fault,"--","counter","--keys","100000","--rounds","300"],capture_output=True,text=True)
    lines=(p.stdout+p.stderr).splitlines()
    ok = sum('counter: OK' in l for l in lines)
    if mode=='worker':
        lost=[ts(l) for l in lines if 'disconnected before the job finished' in l and 'waits up to' in l]
        rep=[ts(l) for l in lines if 'replaced by node' in l]
        closed=[ts(l) for l in lines if 'closing connection from' in l]
        res.append((seed, fault, p.returncode, ok, (lost[0]-min(closed))*1e3 if lost and closed else None, (rep[0]-lost[0])*1e3 if rep and lost else None))
    else:
        rs=[ts(l) for l in lines if 'coordinator restarted' in l]
        lost=[ts(l) for l in lines if 'lost the coordinator' in l]
        rec=[ts(l) for l in lines if 'reconnected to the coordinator' in l]
        res.append((seed, fault, p.returncode, ok, (rs[0]-min(lost))*1e3 if rs and lost else None, (max(rec[:5])-rs[0])*1e3 if rec and rs else None))
for r in res: print(r)
