"""A/B of scan_tiles JSON runs: python ab.py old1.json old2.json -- new1.json new2.json"""
import json, sys, statistics
args = sys.argv[1:]
cut = args.index("--")
def load(files):
    acc = {}
    for f in files:
        try:
            rows = json.load(open(f))
        except Exception as e:
            print("skip", f, e); continue
        for r in rows:
            key = (r["batch"], r["gamma"], r["alpha"], r["kv_dim"], r["l2"])
            d = acc.setdefault(key, {"bytes": r["accepted_kv_bytes"]})
            for name, v in r["gpu_us"].items():
                d.setdefault(name, []).append(v)
    return acc
old, new = load(args[:cut]), load(args[cut + 1:])
print(f"{'point':22} {'l2':4} {'MB':>6} {'old':>7} {'new':>7} {'new/old':>7} {'two':>7} {'new/two':>7} {'bar':>6} {'floor':>5}")
for key in sorted(new, key=lambda k: (k[4], k)):
    n, o = new[key], old.get(key, {})
    med = lambda d, name: statistics.median(d[name]) if name in d else float("nan")
    ns, os_ = med(n, "fused_scan[default]"), med(o, "fused_scan[default]")
    two = min(med(n, "ballot+pack_cuda"), med(n, "ballot+pack_scan"))
    mb = n["bytes"] / 1e6
    bar = 1.3 * 2 * n["bytes"] / 4010e3 + 2 if key[4] == "cold" and n["bytes"] >= 4e6 else float("nan")
    print(f"{key[0]}:{key[1]}:{key[2]}:{key[3]:<8} {key[4]:4} {mb:6.2f} {os_:7.2f} {ns:7.2f} {ns/os_:7.3f} {two:7.2f} {ns/two:7.3f} {bar:6.2f} {med(n,'launch floor'):5.2f}")
