"""Per-step host update figures of the runs in seq64/ or seq8/: python3 summary.py seq8"""
import json, glob, statistics, os, sys
folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[1])
rows = {}
for path in sorted(glob.glob(f'{folder}/*-*-*.json')):
    name = os.path.basename(path)[:-5]
    rnd, rest = name.split('-', 1)
    mode, build = rest.rsplit('-', 1)
    text = open(path).read().strip()
    if not text:
        print('empty', name); continue
    r = json.loads(text)
    load = open(f'{folder}/load-{rnd}-{mode}-{build}.txt').read().strip()
    ups = [s['host_update_ms'] for s in r['steps']]
    print(f"round {rnd} {mode:20} {build:6} params {r['parameters']} host_bytes {r['host_bytes']} "
          f"host update/step ms {[round(u) for u in ups]} median {statistics.median(ups):.0f}  step median {r['median_step_ms']:.0f} "
          f"idle {[round(s['optimizer_idle_ms']) for s in r['steps']]} load {load}")
    rows.setdefault((mode, build), []).append(statistics.median(ups))
    rows.setdefault((mode, build, 'step'), []).append(r['median_step_ms'])
print()
for key, values in sorted(rows.items()):
    print(key, [round(v) for v in values], 'median of rounds', round(statistics.median(values)))
