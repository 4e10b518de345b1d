#!/usr/bin/env python3
# Medians over repeated runs of scripts/bench.sh: python3 scripts/summarize_bench.py FILE.jsonl
import json,sys,collections,statistics
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
g=collections.defaultdict(list)
for r in rows:
    if r['case']=='iperf3': g[('iperf3',)].append(r['gbps']); continue
    key=(r['case'],r['servers'],r['workers'],r['bytes'],r['op'],r.get('latency'))
    g[key].append(r)
for k,v in g.items():
    if k[0]=='iperf3': print('iperf3', [round(x,2) for x in v], 'median', round(statistics.median(v),2)); continue
    if k[5]: print(k, 'p50', [round(x['p50_us'],1) for x in v], 'p99',[round(x['p99_us'],1) for x in v]); continue
    if k[0]=='sparse': print(k, 'Mkeys/s', [round(x['keys_per_s']/1e6,1) for x in v], 'median', round(statistics.median([x['keys_per_s']/1e6 for x in v]),1)); continue
    print(k, 'GB/s', [round(x['gbps'],2) for x in v], 'median', round(statistics.median([x['gbps'] for x in v]),2))
