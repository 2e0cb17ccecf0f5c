"""results.json -> Markdown tables. Pure functions of the results dict, unit-tested."""

from __future__ import annotations

import statistics

from . import exp_random, exp_zcache
from .exp_fio import TEST_NAMES, compare


def _t(v, digits=2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _status_cell(point: dict, key: str = "mean_s") -> str:
    st = point.get("status")
    if st is None:
        return "-"
    if st != "ok":
        return st.upper() if st in ("oom", "timeout") else st
    return _t(point.get(key))


def table(headers: list, rows: list) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _mib(v) -> str:
    return "-" if not v else f"{v / (1 << 20):.1f}"


def _recipe_rows(cfgs: dict, key: str, sp: dict) -> list:
    rows = []
    for name, r in cfgs.items():
        if "skipped" in r or "error" in r:
            rows.append([r.get("label", name), "skipped: " + r["skipped"] if "skipped" in r else "error: " + r["error"]]
                        + [""] * 8)
            continue
        rec = r.get(key)
        if rec is None:
            continue
        runs = " ".join(_t(x["wall_s"]) if x["status"] == "ok" else x["status"].upper() for x in rec["runs"])
        s = sp.get(name) if "speedup" in sp.get(name, {}) else None
        spread = "-" if rec.get("min_s") is None else f"{rec['min_s']:.2f}-{rec['max_s']:.2f}"
        # The recipe hardly swaps (as in the seed); the sweep shows the ratio under load.
        best = max((x for x in r.get("sweep", []) if x.get("compression_ratio")),
                   key=lambda x: x.get("ratio_sample", {}).get("orig_data_size") or 0, default=None)
        rows.append([r["label"], runs, _status_cell(rec), _status_cell(rec, "median_s"), spread,
                     "-" if not s else f"{s['speedup'] * 100:+.0f}%",
                     _mib(rec.get("peak_cg_swap_bytes")),
                     _mib(rec.get("peak_mem_used_total")),
                     "-" if not rec.get("compression_ratio") else f"{rec['compression_ratio']:.2f}:1",
                     "-" if best is None else f"{best['compression_ratio']:.2f}:1 ({best['mode']} {best['factor']:g}x)"])
    return rows


RECIPE_HEAD = ["config", "runs (s)", "mean 2.. (s)", "median 2.. (s)", "range 2.. (s)", "speedup vs disk",
               "swapped MiB (peak)", "device MiB (peak)", "ratio", "ratio in sweep"]


def _hdd_line(cfgs: dict, sp: dict) -> list:
    """Each configuration's mean time as a fraction of disk swap on the seeds' hard disk."""
    cells = [f"{cfgs[n]['label']} {v['x_over_disk_hdd']:.2f}x" for n, v in sp.items()
             if "x_over_disk_hdd" in v and n != "disk-hdd"]
    if not cells:
        return []
    return ["Time against disk swap on the seeds' hard disk (disk-hdd, means of runs 2..): " + ", ".join(cells) + ".", ""]


def scan_tables(scan: dict) -> str:
    p = scan["params"]
    cfgs = scan["configs"]
    out = [f"#### scan recipe: `scan {p['recipe_mib']} {p['recipe_passes']}` ({p['recipe_mode']}) in a "
           f"{p['recipe_limit_bytes'] >> 20} MiB machine, {p['recipe_runs']} runs",
           "",
           table(RECIPE_HEAD, _recipe_rows(cfgs, "recipe", scan.get("speedup_vs_disk", {}))),
           "",
           "Speedup is the seed's (t_disk - t) / t_disk of the means of runs 2.., within this run "
           "(seed 004: +33% for ramzswap). Swapped MiB is the cgroup's swap use (seed 004: 28-32 MB). "
           "Device MiB is memory used by the compressed store, outside the cgroup's limit (for nbdkit: its "
           "resident size, which --swap's mlockall inflates). Ratio: orig_data_size / mem_used_total where the "
           "device held most data; none below 4 MiB stored. A speedup smaller than the range of the runs is noise.",
           ""]
    out += _hdd_line(cfgs, scan.get("speedup_vs_disk", {}))
    pr = p.get("pressure_recipe")
    if pr and any(r.get("pressure") for r in cfgs.values()):
        out += [f"#### scan recipe at the seed's pressure: `scan {pr['mib']} {pr['passes']}` ({pr['mode']}) in a "
                f"{pr['limit_bytes'] >> 20} MiB machine, {pr['runs']} runs", "",
                table(RECIPE_HEAD, _recipe_rows(cfgs, "pressure", scan.get("pressure_speedup_vs_disk", {}))), ""]
    modes = sorted({pt["mode"] for r in cfgs.values() for pt in r.get("sweep", [])})
    names = [n for n, r in cfgs.items() if r.get("sweep")]
    for mode in modes:
        factors = sorted({pt["factor"] for n in names for pt in cfgs[n]["sweep"] if pt["mode"] == mode})
        rows = []
        for f in factors:
            row = [f"{f:g}x"]
            mib = None
            for n in names:
                pt = next((x for x in cfgs[n]["sweep"] if x["mode"] == mode and x["factor"] == f), None)
                row.append("-" if pt is None else _status_cell(pt, "median_s"))
                mib = mib or (pt and pt["mib"])
            row.insert(1, mib)
            rows.append(row)
        out += [f"#### scan sweep, {mode}: median wall time (s) of runs 2.. of `scan M {p['sweep_passes']}` in a "
                f"{p['sweep_limit_bytes'] >> 20} MiB machine",
                "", table(["M / limit", "M (MiB)"] + [cfgs[n]["label"] for n in names], rows), ""]
    return "\n".join(out)


def fio_tables(fio: dict) -> str:
    order = [n for n in fio.get("order", fio["configs"].keys()) if fio["configs"].get(n, {}).get("points")]
    out = []
    skipped = [(n, r) for n, r in fio["configs"].items() if "skipped" in r or "error" in r]
    for n, r in skipped:
        out.append(f"- {r.get('label', n)}: {r.get('skipped') or r.get('error')}")
    if len(order) < 2:
        return "\n".join(out + ["", "(fewer than two configurations measured: no comparison)"])
    a, b = order[0], order[1]
    la, lb = fio["configs"][a]["label"], fio["configs"][b]["label"]
    pairs = compare(fio["configs"][a]["points"], fio["configs"][b]["points"])
    p = fio["params"]
    out += [f"#### fio (iozone-style, mmap) in a {p['limit_bytes'] >> 20} MiB machine with a "
            f"{int(p['ballast_factor'] * 100)}% ballast of anonymous memory: MB/s, {la} vs {lb}", ""]
    for fb in sorted({x["file_bytes"] for x in pairs}):
        recs = sorted({x["record_bytes"] for x in pairs if x["file_bytes"] == fb})
        rows = []
        for rb in recs:
            row = [f"{rb >> 10}"]
            for test in p["tests"]:
                x = next((y for y in pairs if y["file_bytes"] == fb and y["record_bytes"] == rb and y["test"] == test),
                         None)
                row.append("-" if x is None or x["a_bw"] is None or x["b_bw"] is None else
                           f"{x['a_bw'] / 1e6:.0f} / {x['b_bw'] / 1e6:.0f}")
            rows.append(row)
        out += [f"File {fb >> 20} MiB, cells `{la} / {lb}` in MB/s:", "",
                table(["rec KiB"] + [TEST_NAMES[t] for t in p["tests"]], rows), ""]
        rows = []
        for test in p["tests"]:
            xs = [y for y in pairs if y["file_bytes"] == fb and y["test"] == test and y["ratio"] is not None]
            if not xs:
                continue
            ma = statistics.mean(y["a_bw"] for y in xs) / 1e6
            mb = statistics.mean(y["b_bw"] for y in xs) / 1e6
            rows.append([TEST_NAMES[test], f"{ma:.0f}", f"{mb:.0f}", f"{mb / ma:.2f}" if ma else "-",
                         f"{statistics.median(y['ratio'] for y in xs):.2f}"])
        out += [f"File {fb >> 20} MiB, average over record sizes (the seed 003 layout):", "",
                table(["test", f"{la} MB/s", f"{lb} MB/s", "ratio of averages", "median of ratios"], rows), ""]
        all_ratios = [y["ratio"] for y in pairs if y["file_bytes"] == fb and y["ratio"]]
        if all_ratios:
            med = statistics.median(all_ratios)
            out += [f"Median ratio over all tests and record sizes: {med:.2f} "
                    f"({(med - 1) * 100:+.1f}% for {lb}; seed 000 saw -24.8% wall time with ramzswap, "
                    "seed 003 +2% to +247% throughput with zcache).", ""]
    return "\n".join(out)


def app_tables(app: dict) -> str:
    p = app["params"]
    sizes = app["sizes"]
    labels = list(sizes.keys())
    counts = sorted({pt["n"] for s in sizes.values() for pt in s.get("points", [])} | set(p["counts"]))
    rows = []
    for n in counts:
        row = [n]
        for lab in labels:
            s = sizes[lab]
            pt = next((x for x in s.get("points", []) if x["n"] == n), None)
            if "skipped" in s:
                row.append("skipped")
            elif pt is None:
                row.append("")
            else:
                row.append(_status_cell(pt, "total_s"))
        rows.append(row)
    head = ["N"] + [f"{lab} ({sizes[lab]['percent']}%)" for lab in labels]
    out = [f"#### app cycle: seconds for {p['cycles']} cycles through N instances of Debian's python3 holding "
           f"{p['instance_mib']} MiB of the dpkg database each, {p['limit_bytes'] >> 20} MiB machine, "
           f"compressed device: {app['backend']}", "",
           table(head, rows), "",
           "OOM: the kernel's OOM killer killed an instance; larger N were not tried for that size. "
           "Empty: not run.", ""]
    rows = []
    for lab in labels:
        for pt in sizes[lab].get("points", []):
            if pt.get("compression_ratio"):
                rs = pt.get("ratio_sample", {})
                rows.append([lab, pt["n"], _mib(rs.get("orig_data_size")), _mib(rs.get("compr_data_size")),
                             _mib(rs.get("mem_used_total")), f"{pt['compression_ratio']:.2f}:1"])
    if rows:
        out += ["Compression ratio seen (orig_data_size / mem_used_total at the largest orig_data_size; "
                "seed 002 saw at least 4:1):", "",
                table(["size", "N", "orig MiB", "compr MiB", "mem_used MiB", "ratio"], rows), ""]
    rows = [[lab, pt["n"], f"{st['after_s']:g}", _mib(st.get("orig_data_size")), _mib(st.get("mem_used_total")),
             st.get("recompress_done") if st.get("recompress_done") is not None else "-",
             st.get("bd_count") if st.get("bd_count") else "-",
             "-" if not st.get("compression_ratio") else f"{st['compression_ratio']:.2f}:1"]
            for lab in labels for pt in sizes[lab].get("points", []) if (st := pt.get("settled"))]
    if rows:
        out += ["After the cycles, the instances idle (settle_s), then the device again:", "",
                table(["size", "N", "idle s", "orig MiB", "mem_used MiB", "recompressed pages", "cold pages", "ratio"], rows), ""]
    return "\n".join(out)


def _kbs(v) -> str:
    """bytes/s -> iozone's KB/s (1024 bytes), as the seed reports."""
    return "-" if v is None else f"{v / 1024:.0f}"


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}"


VARIANT_TEXT = {
    "fast": "the image on this machine's virtual disk (host-cached: fast)",
    "slow": "the image behind nbdkit filters with the seed's hard disk figures",
}


def _zcache_variant(z: dict, variant: str, v: dict) -> list:
    p = z["params"]
    cfgs = v["configs"]
    order = [n for n in v.get("order", cfgs.keys()) if n in cfgs]
    measured = [n for n in order if exp_zcache.ok_points(cfgs[n])]
    head = f"#### zcache, {variant} disk: {VARIANT_TEXT.get(variant, variant)}"
    out = [head, ""]
    if variant == "slow":
        sd = v.get("slow_disk") or p.get("slow_disk", {})
        cal = v.get("calibration")
        line = (f"Slow disk: one request at a time, {sd.get('read_delay_ms')} ms per read and "
                f"{sd.get('write_delay_ms')} ms per write request, {sd.get('seq_bytes_per_s', 0) / 1e6:.0f} MB/s "
                "(nbdkit noparallel + delay + rate filters in front of `nbdkit file`, via nbdfuse and a loop "
                "device; `direct` is ext4 on that loop device, the other three read it as their origin)")
        if cal:
            line += (f"; measured alone: {cal['seq_read_1m']['bw_bytes'] / 1e6:.1f} MB/s sequential (1 MiB reads), "
                     f"{cal['rand_read_4k']['iops']:.0f} random 4 KiB reads/s (the seed's disk: about 75 MB/s "
                     "and 700/s)")
        out += [line + ".", ""]
    for n in order:
        r = cfgs[n]
        if "skipped" in r:
            out.append(f"- {r.get('label', n)}: skipped: {r['skipped']}")
        elif "error" in r:
            out.append(f"- {r.get('label', n)}: error: {r['error']}")
        if r.get("leftovers"):
            out.append(f"- {r.get('label', n)}: left behind: {', '.join(r['leftovers'])}")
    if not measured:
        return out + ["", "(no configuration measured)", ""]
    if out[-1] != "":
        out.append("")
    base = "direct" if "direct" in measured else None
    for engine in p["engines"]:
        avgs = {n: exp_zcache.averages_per_test(cfgs[n], p["tests"], engine) for n in measured}
        if not any(avgs.values()):
            continue
        ratios = {n: exp_zcache.ratios_vs(avgs[base], avgs[n]) if base else {} for n in measured}
        rows = []
        for t in p["tests"]:
            row = [TEST_NAMES[t]]
            for n in measured:
                cell = _kbs(avgs[n].get(t))
                if base and n != base and t in ratios[n]:
                    cell += f" ({ratios[n][t]:.2f})"
                row.append(cell)
            rows.append(row)
        recs = ", ".join(f"{b >> 10}" for b in p["record_sizes"])
        out += [f"Average KB/s over record sizes {recs} KiB, `{engine}` "
                f"({'mmap, as iozone -B' if engine == 'mmap' else 'read(2)/write(2)'}); "
                f"in brackets the ratio to {cfgs[base]['label'] if base else '-'} (the seed's \"Ratio\"):", "",
                table(["test"] + [cfgs[n]["label"] for n in measured], rows), ""]
    rows = []
    for n in measured:
        r = cfgs[n]
        tr = exp_zcache.read_traffic(r)
        dev = r.get("device", {})
        fin = r.get("final_stats", {})
        cached = mem = per = "-"
        if n in exp_zcache.COMPCACHE_CACHES:
            sample = dev.get("ratio_sample") or fin
            cached, mem = _mib(sample.get("orig_data_size")), _mib(sample.get("mem_used_total"))
            per = _ratio(exp_zcache.memory_per_cached_byte(sample))
        elif n == "nbdkit-cache":
            cached = mem = _mib(dev.get("peak_cache_file_bytes"))
            per = "1 (uncompressed)"
        rows.append([r["label"], _mib(tr["dev_read_bytes"]), _mib(tr["origin_read_bytes"]),
                     _ratio(tr["origin_per_read"]), "-" if tr["hit_ratio"] is None else f"{tr['hit_ratio']:.1%}",
                     cached, mem, per])
    out += [f"Caches, over the read tests (read, re-read, random, backward, stride), budget "
            f"{p['budget_bytes'] >> 20} MiB each:", "",
            table(["config", "asked of the disk MiB", "reached the origin MiB", "origin / asked", "hit ratio",
                   "cached MiB (peak)", "cache memory MiB (peak)", "memory per cached byte"], rows), "",
            "Asked of the disk: what the page cache missed (reads of the disk's block device). Reached the "
            "origin: what the cache in between missed (1.00 without one; nbdkit's 64 KiB cache blocks can read "
            "more than was asked). Hit ratio: compcache's cache_hits / (cache_hits + cache_misses) in pages. "
            "Memory per cached byte: mem_used_total / orig_data_size where compcache held the most (zram's names); "
            "nbdkit's cache is its cache file on a tmpfs, uncompressed.", ""]
    cc = cfgs.get("compcache-cache")
    if cc and any(x.get("cache") for x in cc.get("points", [])):
        rows = []
        for t in p["tests"]:
            tr = exp_zcache.read_traffic(cc, (t,))
            c = tr["cache"]
            rows.append([TEST_NAMES[t], c.get("cache_hits", "-"), c.get("cache_misses", "-"),
                         "-" if tr["hit_ratio"] is None else f"{tr['hit_ratio']:.1%}", _mib(tr["origin_read_bytes"]),
                         c.get("readahead_used", "-"), c.get("readahead_wasted", "-")])
        out += ["compcache's counters per test (pages; summed over record sizes and engines):", "",
                table(["test", "cache_hits", "cache_misses", "hit ratio", "origin read MiB", "readahead_used",
                       "readahead_wasted"], rows), ""]
    for n in measured:
        for engine in p["engines"]:
            pts = [x for x in exp_zcache.ok_points(cfgs[n]) if x["engine"] == engine]
            if not pts:
                continue
            rows = []
            for rb in p["record_sizes"]:
                row = [p["file_bytes"] >> 10, rb >> 10]
                for t in p["tests"]:
                    x = next((y for y in pts if y["record_bytes"] == rb and y["test"] == t), None)
                    row.append("-" if x is None else _kbs(x["bw_bytes"]))
                rows.append(row)
            out += [f"{cfgs[n]['label']}, `{engine}`, KB/s (the seed's results layout):", "",
                    table(["KB", "reclen"] + [TEST_NAMES[t] for t in p["tests"]], rows), ""]
    return out


def zcache_tables(z: dict) -> str:
    p = z["params"]
    out = [f"### zcache (seed 003): iozone-style fio on ext4, a {p['file_bytes'] >> 20} MiB file, the page cache "
           f"held to {p['limit_bytes'] >> 20} MiB by a memory cgroup, caches of {p['budget_bytes'] >> 20} MiB", "",
           "direct: ext4 on the origin itself (no cache). nbdkit file: the same origin through `nbdkit file`, "
           "nbdfuse and a loop device (the transport, no cache). nbdkit cache: nbdkit's cache filter "
           "(uncompressed, in RAM) in front of that. compcache cache: `compcache serve --origin` (compressed), "
           "through nbdfuse and a loop device (two userspace hops). compcache cache (FUSE): `compcache fuse "
           "--origin`, its own FUSE file on a loop device (one hop). "
           f"File content compresses about {100 / max(1, 100 - p['compress_percentage']):.0f}:1 "
           f"(fio buffer_compress_percentage={p['compress_percentage']}).", ""]
    for variant, v in z.get("variants", {}).items():
        out += _zcache_variant(z, variant, v)
    return "\n".join(out)


def _n(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def random_tables(rnd: dict) -> str:
    """Issue 30's experiment: per measure, each configuration's times and its ratio to the
    baseline in the same round."""
    p = rnd["params"]
    cfgs = rnd["configs"]
    base = rnd["baseline"]
    base_label = cfgs.get(base, {}).get("label", base)
    out = [f"#### random-access swap (issue 30): SQLite point lookups in a {p['table_mib']} MiB in-memory table "
           f"in a {p['limit_bytes'] >> 20} MiB machine, {p['lookups']} lookups, {p['rounds']} rounds alternating", ""]
    for name, c in cfgs.items():
        bad = [f"round {r['round'] + 1}: {r.get('skipped') or r.get('error')}" for r in c["rounds"]
               if r.get("skipped") or r.get("error")]
        if bad:
            out.append(f"- {c['label']}: " + "; ".join(bad))
    if out[-1] != "":
        out.append("")
    summ = rnd.get("summary", {})
    for workload, what, label in exp_random.MEASURES:
        s = summ.get(f"{workload}:{what}")
        if not s:
            continue
        if workload == "scan":
            sc = p["scan"]
            title = (f"`scan {sc['mib']} {sc['passes']}` ({sc.get('mode', 'cyclic')}) in a "
                     f"{sc['limit_bytes'] >> 20} MiB machine, in the same rounds")
        else:
            title = {"lookup_s": "the lookups (random access)", "wall_s": "the whole program",
                     "build_s": "building the table (rows appended in key order)"}[what]
        rows = []
        for name, e in s["configs"].items():
            ratio = "-" if "ratio_median" not in e else (
                f"{e['ratio_median']:.2f}x ({e['ratio_min']:.2f}-{e['ratio_max']:.2f})")
            rows.append([cfgs[name]["label"], " ".join(f"{t:.2f}" for t in e["times"]) + (
                f" ({e['failed']} failed)" if e["failed"] else ""), _t(e["median_s"]), ratio,
                _n(e.get("majflt")), _n(e.get("pswpin")), _n(e.get("pswpout")), _n(e.get("device_reads")),
                _t(e.get("cpu_us_per_page"), 1)])
        faults = "major faults (lookups, the program's own)" if what == "lookup_s" else "major faults (cgroup)"
        out += [f"Time of {title}:", "",
                table(["config", "runs (s)", "median (s)", f"ratio to {base_label}: median (range)", faults,
                       "pswpin", "pswpout", "device reads", "CPU per swapped page (us)"], rows), ""]
    out += [f"Ratios are taken within a round (the same minutes), then the median and range over the rounds. "
            "pswpin and pswpout are /proc/vmstat's changes over the whole run (machine-wide, under the host-swap "
            "lock), device reads the device's own read requests (none for a swap file); CPU per swapped page is the "
            "time the whole machine's CPUs were busy during the run (/proc/stat) over pswpin + pswpout, the "
            "program's own work included; medians over the runs.", ""]
    return "\n".join(out)


def markdown(results: dict) -> str:
    m = results["machine"]
    out = [f"### compcache bench, profile `{results['profile']}`, {results.get('started_utc', '')}", "",
           f"Kernel {m.get('kernel')}, {m.get('cpus')} CPUs ({m.get('cpu_model', '?')}), "
           f"{m.get('mem_total_kib', 0) >> 20} GiB, cgroup {' '.join(m.get('cgroup', []))}; "
           f"{'; '.join(f'{k} {v}' for k, v in m.get('versions', {}).items())}. "
           f"Load average at start {' '.join(m.get('loadavg_at_start', ['?']))}, "
           f"at end {' '.join(m.get('loadavg_at_end', ['?']))}; elapsed {results.get('elapsed_s', '?')} s.", ""]
    exps = results.get("experiments", {})
    if "scan" in exps:
        out.append(scan_tables(exps["scan"]))
    if "fio" in exps:
        out.append(fio_tables(exps["fio"]))
    if "app" in exps:
        out.append(app_tables(exps["app"]))
    if "zcache" in exps:
        out.append(zcache_tables(exps["zcache"]))
    if "random" in exps:
        out.append(random_tables(exps["random"]))
    if results.get("leftovers"):
        out.append("**Left behind after the run:** " + ", ".join(results["leftovers"]))
    return "\n".join(out) + "\n"
