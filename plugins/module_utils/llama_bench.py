"""Pure logic of the MTP benchmark: Prometheus metrics, per-request timings, summaries, the table.

No Ansible imports. The llama_bench module does the HTTP; this file turns what llama-server
answered into numbers: tokens/s from /completion ``timings`` (predicted_per_second), draft
acceptance from /metrics (``spec_decode_num_accepted_tokens_total`` /
``spec_decode_num_draft_tokens_total``; llama-server has no acceptance gauge), the speed-up
against the run without MTP, and the best draft length.
"""

from __future__ import annotations

import itertools
import math
import statistics

SPEC_DRAFT = "llamacpp:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
SPEC_DRAFTS = "llamacpp:spec_decode_num_drafts_total"
TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"


class BenchError(ValueError):
    """A benchmark input or server answer that cannot be used."""


def metrics_delta(before: dict, after: dict) -> dict:
    """Counter increase between two scrapes (for the counters the benchmark reads)."""
    keys = (SPEC_DRAFT, SPEC_ACCEPTED, SPEC_DRAFTS, TOKENS_PREDICTED)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}


def completion_sample(answer: dict) -> dict:
    """One /completion answer -> {tokens, seconds, tok_s, draft_n, draft_accepted}."""
    t = answer.get("timings")
    if not isinstance(t, dict) or "predicted_per_second" not in t:
        raise BenchError("the /completion answer has no timings.predicted_per_second (is this llama-server?)")
    n = int(t.get("predicted_n") or 0)
    if n <= 0:
        raise BenchError("the server predicted no tokens: raise n_predict or check the prompt")
    return {
        "tokens": n,
        "seconds": float(t.get("predicted_ms") or 0.0) / 1000.0,
        "tok_s": float(t["predicted_per_second"]),
        # present only when draft_n > 0 (server-common.cpp)
        "draft_n": int(t.get("draft_n") or 0),
        "draft_accepted": int(t.get("draft_n_accepted") or 0),
    }


def summarize(
    label: str,
    draft_n_max,
    samples: list,
    delta: dict | None = None,
    *,
    concurrency: int = 1,
    rounds: list | None = None,
    spec_draft_p_min=None,
) -> dict:
    """Median tokens/s over the samples, and acceptance from the metrics delta (else the timings).

    ``rounds``: ``[(tokens, seconds)]`` of each round in which ``concurrency`` closed-loop clients each sent the
    prompts once: the served tokens/s of the whole instance (all streams together, over the wall time). The figure
    the benchmark compares, ``tok_s``, is that at a concurrency above 1 (the load the instance is declared for:
    its slots), else the median decode tokens/s of the one stream."""
    if not samples:
        raise BenchError(f"no samples for {label}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise BenchError(f"concurrency must be a positive integer, got {concurrency!r}")
    served = [t / sec for t, sec in rounds or [] if sec > 0]
    tok_s = [s["tok_s"] for s in samples]
    drafted = sum(s["draft_n"] for s in samples)
    accepted = sum(s["draft_accepted"] for s in samples)
    if delta and delta.get(SPEC_DRAFT, 0) > 0:
        drafted_m, accepted_m = delta[SPEC_DRAFT], delta[SPEC_ACCEPTED]
        acceptance = accepted_m / drafted_m
        source = "metrics"
    elif drafted > 0:
        acceptance = accepted / drafted
        source = "timings"
    else:
        acceptance = None
        source = None
    median = round(statistics.median(tok_s), 2)
    served_median = round(statistics.median(served), 2) if served else None
    if concurrency > 1 and served_median is None:
        raise BenchError(f"no timed rounds for {label} at concurrency {concurrency}")
    return {
        "label": label,
        "mtp": draft_n_max is not None,
        "draft_n_max": draft_n_max,
        "spec_draft_p_min": spec_draft_p_min if draft_n_max is not None else None,
        "concurrency": concurrency,
        "tok_s": served_median if concurrency > 1 else median,
        "served_tok_s": served_median,
        "served_tok_s_samples": [round(x, 2) for x in served],
        "runs": len(samples),
        "tokens": sum(s["tokens"] for s in samples),
        "tok_s_median": median,
        "tok_s_min": round(min(tok_s), 2),
        "tok_s_max": round(max(tok_s), 2),
        "tok_s_samples": [round(x, 2) for x in tok_s],
        "draft_tokens": drafted,
        "draft_accepted": accepted,
        "acceptance": None if acceptance is None else round(acceptance, 4),
        "acceptance_source": source,
    }


def _figure(row):
    """The figure rows are compared on (``summarize``'s ``tok_s``; rows from before it: the median)."""
    value = row.get("tok_s")
    return row["tok_s_median"] if value is None else value


def compare(rows: list) -> dict:
    """Add speed-up vs the run without MTP, pick the best MTP configuration (highest ``tok_s``: one stream's median,
    or the served tokens/s at the instance's concurrency): its draft length and p-min (null: llama.cpp's default)."""
    base = [r for r in rows if not r["mtp"]]
    if not base:
        raise BenchError("no baseline run without MTP: cannot compute a speed-up")
    levels = sorted({r.get("concurrency") or 1 for r in rows})
    if len(levels) > 1:
        raise BenchError(f"rows measured at different concurrencies {levels} cannot be compared")
    base_tok_s = _figure(base[0])
    for r in rows:
        r["speedup"] = round(_figure(r) / base_tok_s, 3) if base_tok_s > 0 else None
    mtp_rows = [r for r in rows if r["mtp"]]
    best = max(mtp_rows, key=_figure) if mtp_rows else None
    wins = bool(best) and _figure(best) > base_tok_s
    return {
        "baseline_tok_s": base_tok_s,
        "concurrency": levels[0],
        "rows": rows,
        "best_label": best["label"] if best else None,
        "best_draft_n_max": best["draft_n_max"] if wins else None,
        "best_spec_draft_p_min": best.get("spec_draft_p_min") if wins else None,
        "best_speedup": best["speedup"] if best else None,
    }


def table(result: dict) -> list:
    """Human-readable lines (one per configuration); the roofline columns when the result has them."""
    roof = "bandwidth_bytes_per_s" in result
    served = (result.get("concurrency") or 1) > 1
    head = f"{'config':<18}{'tok/s':>9}{'min':>9}{'max':>9}{'accept':>9}{'speedup':>9}"
    head += f"{'served':>10}" if served else ""
    lines = [head + (f"{'MB/token':>10}{'eff %':>8}" if roof else "")]
    for r in result["rows"]:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        line = (
            f"{r['label']:<18}{r['tok_s_median']:>9.1f}{r['tok_s_min']:>9.1f}{r['tok_s_max']:>9.1f}"
            f"{acc:>9}{r['speedup']:>8.2f}x"
        )
        if served:
            line += f"{r['served_tok_s'] or 0:>10.1f}"
        if roof:
            eff = "-" if r.get("efficiency_pct") is None else f"{r['efficiency_pct']:.1f}"
            line += f"{r['bytes_per_token'] / 1e6:>10.1f}{eff:>8}"
        lines.append(line)
    best = result.get("best_draft_n_max")
    p_min = result.get("best_spec_draft_p_min")
    lines.append(
        (f"best draft-n-max: {best}" + (f", p-min {p_min}" if p_min is not None else ""))
        if best is not None
        else "MTP did not beat the baseline here"
    )
    if served:
        lines.append(
            f"tok/s, min, max: one stream's decode speed; served: all {result['concurrency']} streams together "
            "(the figure compared, the speed-up's)"
        )
    if roof:
        bw = result["bandwidth_bytes_per_s"]
        lines.append(
            f"bandwidth: {'unknown' if not bw else f'{bw / 1e9:.1f} GB/s'} ({result.get('bandwidth_source') or '-'}); "
            f"decode step reads {result['decode_bytes']['token'] / 1e6:.1f} MB"
            + (f", plain-decode limit {bw / result['decode_bytes']['token']:.1f} tok/s" if bw else "")
        )
    return lines


def sweep_gap(rows: list, default_label: str, configs: list = None) -> dict:
    """The fastest sweep configuration against the rendered default: gap = (best - default) / best in %.

    Rows with the same label (the default is measured first and again among the others, to show the
    spread on a busy host) count with the median of their medians. A configuration of ``configs`` marked
    ``same_as: <default_label>`` (the flags llama.cpp chooses itself when the role renders none) is the
    default measured once more: its rows count as the default's, not as a rival, so that run-to-run noise
    between two measurements of one configuration is never reported as a gap. ``spread_pct`` is that
    noise: (fastest - slowest) / fastest of the default's measurements.
    """
    if not rows:
        raise BenchError("the sweep measured nothing")
    same = {c["label"] for c in configs or [] if c.get("same_as") == default_label}
    by_label = {}
    for r in rows:
        by_label.setdefault(default_label if r["label"] in same else r["label"], []).append(r["tok_s_median"])
    if default_label not in by_label:
        raise BenchError(f"the sweep has no row {default_label!r} (the rendered default)")
    tok_s = {k: statistics.median(v) for k, v in by_label.items()}
    best = max(tok_s, key=lambda k: tok_s[k])
    d = tok_s[default_label]
    gap = 0.0 if tok_s[best] <= 0 else 100.0 * (tok_s[best] - d) / tok_s[best]
    runs = by_label[default_label]
    spread = 0.0 if max(runs) <= 0 else 100.0 * (max(runs) - min(runs)) / max(runs)
    return {
        "best": {"label": best, "tok_s": round(tok_s[best], 2)},
        "default": {"label": default_label, "tok_s": round(d, 2), "runs": runs, "same_as_default": sorted(same)},
        "gap_pct": round(max(gap, 0.0), 1),
        "within_5pct": gap <= 5.0,
        "spread_pct": round(spread, 1),
        "configs": {k: {"tok_s": round(tok_s[k], 2), "runs": v} for k, v in by_label.items()},
        "lines": [f"{k}: {tok_s[k]:.2f} tok/s ({', '.join(f'{x:.2f}' for x in v)})" for k, v in by_label.items()],
    }


def sweep_configs(kind: str, physical_cores: int = 0, logical_cpus: int = 0, gpu_count: int = 0) -> list:
    """The configurations a flag sweep measures on one host: ``[{label, settings}]``, ``default`` first.

    ``default`` is the instance as the role renders it (no override). CPU hosts: ``threads`` in
    {physical cores, logical CPUs, physical - 1, physical / 2} (llama.cpp's own default is the physical
    cores) with ``threads_batch`` the same or all logical CPUs (the batch a draft-mtp verification
    decodes runs on threads_batch). ``t<physical>-tb<physical>`` is what llama.cpp picks without the
    flags (threads = its count of physical cores, threads-batch = threads), so it carries
    ``same_as: default`` and sweep_gap counts it as the default measured again; on a hybrid P/E-core CPU
    llama.cpp counts only the P-cores and the two may differ. GPU hosts: flash attention on/off, ubatch
    256/1024 (the default is 512), and split mode layer/row with more than one GPU. ``settings`` are
    instance fields.
    """
    out = [{"label": "default", "settings": {}}]
    if kind == "cpu":
        phys = max(1, int(physical_cores or logical_cpus or 1))
        logical = max(phys, int(logical_cpus or phys))
        threads = []
        for t in (phys, logical, phys - 1, phys // 2):
            if t >= 1 and t not in threads:
                threads.append(t)
        for t in threads:
            for tb in sorted({t, logical}):
                c = {"label": f"t{t}-tb{tb}", "settings": {"threads": t, "threads_batch": tb}}
                if t == tb == phys:
                    c["same_as"] = "default"
                out.append(c)
    elif kind == "gpu":
        for fa in ("on", "off"):
            out.append({"label": f"fa-{fa}", "settings": {"flash_attn": fa}})
        for ub in (256, 1024):
            out.append({"label": f"ub{ub}", "settings": {"ubatch_size": ub, "batch_size": max(ub, 2048)}})
        if gpu_count > 1:
            for sm in ("layer", "row"):
                out.append({"label": f"split-{sm}", "settings": {"split_mode": sm}})
    else:
        raise BenchError(f"unknown host kind {kind!r} for a sweep (cpu or gpu)")
    return out


def _noise(row):
    """Half the spread of a measurement's requests, relative to its median (0.03: +/- 3 %)."""
    med = row.get("tok_s_median") or 0
    if med <= 0 or row.get("tok_s_max") is None or row.get("tok_s_min") is None:
        return None
    return round((row["tok_s_max"] - row["tok_s_min"]) / 2 / med, 4)


def slower_p_value(after: list, before: list):
    """One-sided Mann-Whitney U test: the probability, were both sets of requests from one server, that ``after``
    would rank this low or lower against ``before``. Exact (every arrangement of the pooled samples) for small
    sets, the normal approximation with ties corrected above that. None without samples on both sides."""
    a, b = [float(x) for x in after or []], [float(x) for x in before or []]
    n, m = len(a), len(b)
    if not n or not m:
        return None

    def u_of(xs, ys):  # pairs where the after sample is the larger, ties a half
        return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)

    u = u_of(a, b)
    pooled = a + b
    if math.comb(n + m, n) <= 20000:
        total = hits = 0
        for idx in itertools.combinations(range(n + m), n):
            chosen = set(idx)
            xs = [pooled[i] for i in idx]
            ys = [pooled[i] for i in range(n + m) if i not in chosen]
            total += 1
            hits += u_of(xs, ys) <= u + 1e-9
        return round(hits / total, 4)
    mean = n * m / 2
    counts = {}
    for x in pooled:
        counts[x] = counts.get(x, 0) + 1
    ties = sum(c**3 - c for c in counts.values())
    var = n * m / 12 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    if var <= 0:
        return 1.0
    z = (u + 0.5 - mean) / math.sqrt(var)  # continuity correction
    return round(0.5 * math.erfc(-z / math.sqrt(2)), 4)


def speed_verdict(before: dict, after: dict, margin: float, context: dict | None = None, alpha: float = 0.05) -> dict:
    """The speed gate: is any instance slower after the change than before it, by more than ``margin``?

    ``before`` / ``after``: instance name -> llama_bench row (``summarize``), measured on the same fixed
    prompts at temperature 0 before the host changed and after it passed its health gate. Instances
    measured only once (new, or not restarted) are reported, never judged. ``context``: instance name ->
    ``{build_before, build_after, model_before, model_after}`` for the message.
    An instance is slower when its median fell by more than ``margin`` and its requests after the change rank
    below those before with a one-sided Mann-Whitney p-value under ``alpha`` (``slower_p_value``).
    Returns ``{instances: {name: {tok_s, tok_s_before, change, p_value, acceptance, acceptance_before, noise,
    noise_before, slower, noisy, measurements}}, slower: [name], messages: [str]}`` (``noisy``: a noise above the
    margin, where the gate cannot tell a change of the margin's size from the spread: raise ``runs`` or
    ``n_predict``; ``measurements``: the after row's ``measurements``, 2 where a first figure beyond the margin was
    measured once more and the faster of the two kept, else 1).
    """
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 < margin < 1:
        raise BenchError(f"the speed gate's margin must be a fraction between 0 and 1, got {margin!r}")
    out, slower, messages = {}, [], []
    for name in sorted(set(before or {}) | set(after or {})):
        b, a = (before or {}).get(name), (after or {}).get(name)
        entry = {
            "tok_s": a.get("tok_s_median") if a else None,
            "tok_s_before": b.get("tok_s_median") if b else None,
            "acceptance": a.get("acceptance") if a else None,
            "acceptance_before": b.get("acceptance") if b else None,
            "noise": _noise(a) if a else None,
            "noise_before": _noise(b) if b else None,
            "change": None,
            "p_value": None,
            "slower": False,
            "noisy": False,
            # 2: the first figure after the change was beyond the margin, measured once more, the faster kept
            "measurements": int(a.get("measurements") or 1) if a else None,
        }
        if a and b and b.get("tok_s_median"):
            entry["change"] = round(a["tok_s_median"] / b["tok_s_median"] - 1, 4)
            # Slower: the median fell by more than the margin, and the requests after rank below those before
            # beyond what chance gives (a noisy baseline is not a slowdown); rows without samples: the median.
            entry["p_value"] = slower_p_value(a.get("tok_s_samples"), b.get("tok_s_samples"))
            entry["slower"] = entry["change"] < -margin and (entry["p_value"] is None or entry["p_value"] < alpha)
            # the measurement cannot tell a change of the margin's size from its own spread: say so
            entry["noisy"] = max(entry["noise"] or 0, entry["noise_before"] or 0) > margin
        out[name] = entry
        if entry["slower"]:
            slower.append(name)
            ctx = (context or {}).get(name) or {}

            def acc(x):
                return "no drafts" if x is None else f"MTP acceptance {x:.0%}"

            messages.append(
                f"instance {name!r}: {entry['tok_s']:.1f} tokens/s ("
                + ("the faster of 2 measurements, " if entry["measurements"] == 2 else "")
                + f"{acc(entry['acceptance'])}, noise "
                f"+/-{(entry['noise'] or 0):.1%}) with build {ctx.get('build_after') or '?'} and model "
                f"{ctx.get('model_after') or '?'}, against {entry['tok_s_before']:.1f} tokens/s "
                f"({acc(entry['acceptance_before'])}, noise +/-{(entry['noise_before'] or 0):.1%}) before with build "
                f"{ctx.get('build_before') or '?'} and model {ctx.get('model_before') or '?'}: "
                f"{entry['change']:+.1%}, beyond the speed gate's margin of {margin:.0%}"
                + (f" (p={entry['p_value']:.3f})" if entry["p_value"] is not None else "")
            )
    return {"instances": out, "slower": slower, "messages": messages}
