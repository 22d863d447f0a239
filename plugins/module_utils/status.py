"""The fleet's status table (playbooks/status.yml): one row per instance, from what each host answered now.

Pure logic, no Ansible imports. ``fleet_status`` joins, per host, what ``llama_host_state`` read with ``live``
(systemd state, /health and /metrics of every instance the last converge recorded, that record's facts),
whether the host matches its declared state (``fleet_declared``), and, when the fleet has a monitor, the
Prometheus series of the collection's recording rules over the last minutes. ``render`` turns the rows into
a text table. Nothing here reaches a host.
"""

from __future__ import annotations

import math

SPEC_DRAFT = "llamacpp:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
TOKENS = "llamacpp:tokens_predicted_total"
TOKENS_SECONDS = "llamacpp:tokens_predicted_seconds_total"
BUSY = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"

# The recording rules (role llama_monitoring) a row reads, and the row field each one fills.
PROMETHEUS_SERIES = {
    "llamafleet:instance_decode_tokens_per_second:rate1m": "served_tok_s",
    "llamafleet:instance_request_tokens_per_second:ratio_rate5m": "decode_tok_s",
    "llamafleet:instance_mtp_acceptance:ratio_rate5m": "acceptance",
    "llamafleet:instance_busy_slots": "slots_busy",
}
COLUMNS = (
    ("host", "HOST"),
    ("instance", "INSTANCE"),
    ("url", "URL"),
    ("build", "BUILD"),
    ("mtp", "MTP"),
    ("model", "MODEL"),
    ("sha256_short", "SHA256"),
    ("health", "HEALTH"),
    ("slots", "SLOTS"),
    ("decode", "TOK/S"),
    ("acceptance_text", "ACCEPT"),
    ("source", "FROM"),
    ("draft_n_max_text", "N-MAX"),
    ("declared", "DECLARED"),
)


def _num(value):
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None  # NaN and inf: no figure


def prometheus_figures(result):
    """A Prometheus instant-query ``data.result`` -> {(host, instance): {row field: value}}."""
    out = {}
    for sample in result or []:
        metric = (sample or {}).get("metric") or {}
        field = PROMETHEUS_SERIES.get(metric.get("__name__"))
        value = _num(((sample or {}).get("value") or [None, None])[-1])
        if field and value is not None and metric.get("host") and metric.get("llama_instance"):
            out.setdefault((metric["host"], metric["llama_instance"]), {})[field] = value
    return out


def direct_figures(metrics):
    """One instance's /metrics samples -> the same figures, over the process's life (no rates without two reads)."""
    m = metrics or {}
    tokens, seconds = m.get(TOKENS), m.get(TOKENS_SECONDS)
    drafted, accepted = m.get(SPEC_DRAFT), m.get(SPEC_ACCEPTED)
    return {
        "decode_tok_s": tokens / seconds if tokens and seconds else None,
        "acceptance": accepted / drafted if drafted and accepted is not None else None,
        "slots_busy": m.get(BUSY),
        "deferred": m.get(DEFERRED),
        "tokens_predicted": tokens,
    }


def _declared(declared, commit, ref_commit):
    """(matches, word, reasons): whether the host matches its declared state, and why not."""
    if not isinstance(declared, dict):
        return False, "unknown", []
    if declared.get("failed"):
        return False, "invalid", [str(declared.get("msg") or "the declared state was refused")]
    reasons = list(declared.get("drift") or [])
    if ref_commit and commit and commit != ref_commit:
        reasons.append(f"runs {commit[:12]}, the declared ref names {ref_commit[:12]}")
    if declared.get("converged") and not reasons:
        return True, "yes", []
    return False, "no", reasons or ["not converged to this declared state (site.yml converges it)"]


def _host_row(host, **fields):
    row = dict.fromkeys(k for k, _h in COLUMNS)
    row.update(
        host=host, instance=None, reachable=True, matches_declared=False, declared="unknown", declared_reasons=[]
    )
    row.update(fields)
    return row


def fleet_status(hosts, reads, declared=None, ref_commit=None, prometheus=None):
    """The status rows: ``[{host, instance, url, build, mtp, model, sha256, health, slots_busy, slots_total,
    decode_tok_s, served_tok_s, acceptance, source, draft_n_max, matches_declared, declared, reachable}]``
    (plus the text columns of the table).

    ``reads``: host -> ``{unreachable, failed, msg, state}`` (``state``: llama_host_state read with ``live``).
    ``declared``: host -> the fleet_declared result (``converged``, ``drift``; ``failed`` and ``msg``).
    ``ref_commit``: the commit the declared ref names now (None: not resolved). ``prometheus``: the monitor's
    answer to PROMETHEUS_QUERY (``data.result``), or None without a monitor. A figure from Prometheus is over the
    rules' windows (decode: 5 minutes, served: 1 minute, acceptance: 5 minutes); without one, from the instance's
    own counters since its process started.
    """
    prom = prometheus_figures(prometheus) if prometheus is not None else {}
    rows = []
    for host in hosts or []:
        read = (reads or {}).get(host) or {}
        if read.get("unreachable") or not read:
            rows.append(
                _host_row(
                    host,
                    reachable=False,
                    health="unreachable",
                    message=str(read.get("msg") or "not read").splitlines()[0][:160],
                )
            )
            continue
        if read.get("failed") or not isinstance(read.get("state"), dict):
            rows.append(_host_row(host, health="read failed", message=str(read.get("msg") or "")[:160]))
            continue
        rows += _instance_rows(host, read["state"], (declared or {}).get(host), ref_commit, prom)
    for row in rows:
        _texts(row)
    return rows


def _instance_rows(host, state, declared, ref_commit, prom):
    build = state.get("build") or {}
    matches, word, reasons = _declared(declared, build.get("commit"), ref_commit)
    verdict = {"matches_declared": matches, "declared": word, "declared_reasons": reasons}
    applied = state.get("applied") or {}
    facts = applied.get("facts") or {}
    recorded = {
        i.get("name"): i
        for i in (facts.get("llama_server_systemd_facts") or {}).get("instances") or []
        if isinstance(i, dict)
    }
    models = facts.get("model_fetch_facts") or {}
    speed = ((facts.get("llamafleet_speed") or {}).get("instances")) or {}
    units = state.get("instances") or {}
    names = list(units) + [n for n in recorded if n not in units]
    if not names:
        return [_host_row(host, build=build.get("name"), health="no instance", **verdict)]
    rows = []
    for name in names:
        unit = units.get(name) or {}
        inst = recorded.get(name) or {}
        live = unit.get("live") or {}
        figures = direct_figures(live.get("metrics"))
        from_prom = prom.get((host, name)) or {}
        source = "prometheus" if from_prom else ("instance" if live.get("metrics") else None)
        if from_prom:
            figures = dict(
                figures,
                served_tok_s=from_prom.get("served_tok_s"),
                **{k: from_prom[k] for k in ("decode_tok_s", "acceptance", "slots_busy") if k in from_prom},
            )
        model = inst.get("model")
        rows.append(
            _host_row(
                host,
                instance=name,
                url=inst.get("url") or live.get("url"),
                build=build.get("name"),
                commit=build.get("commit"),
                mtp=(inst.get("spec_type") or build.get("mtp_spec_type") or "on") if inst.get("mtp") else "off",
                model=model,
                sha256=(models.get(model) or {}).get("sha256") if model else None,
                active=unit.get("active_state"),
                health=_health_text(unit, live),
                slots_busy=_int(figures.get("slots_busy")),
                slots_total=_int(inst.get("parallel")),
                decode_tok_s=figures.get("decode_tok_s"),
                served_tok_s=figures.get("served_tok_s"),
                acceptance=figures.get("acceptance"),
                deferred=_int(figures.get("deferred")),
                source=source,
                draft_n_max=inst.get("draft_n_max") if inst.get("mtp") else None,
                baseline_tok_s=_num((speed.get(name) or {}).get("tok_s")),
                message=live.get("error"),
                **verdict,
            )
        )
    return rows


def _int(value):
    n = _num(value)
    return int(n) if n is not None else None


def _health_text(unit, live):
    state = unit.get("active_state")
    if state is None:
        return "not configured"
    if state != "active":
        return f"{state}" + (f" ({unit['sub_state']})" if unit.get("sub_state") else "")
    code = live.get("health")
    if code is None:
        return "active"
    return "healthy" if code == 200 else ("loading" if code == 503 else f"unhealthy ({code})")


def _texts(row):
    """The table's text columns of one row."""
    row["sha256_short"] = (row.get("sha256") or "")[:12] or None
    busy, total = row.get("slots_busy"), row.get("slots_total")
    row["slots"] = f"{'-' if busy is None else busy}/{'-' if total is None else total}" if row.get("instance") else None
    decode = row.get("decode_tok_s")
    row["decode"] = f"{decode:.1f}" if decode is not None else None
    acc = row.get("acceptance")
    row["acceptance_text"] = f"{acc * 100:.0f}%" if acc is not None else None
    n = row.get("draft_n_max")
    row["draft_n_max_text"] = str(n) if n is not None else None


def render(rows, notes=None):
    """The rows as a text table (one line per row, '-' for what is not known), then a line per note."""
    table = [[h for _k, h in COLUMNS]] + [
        ["-" if r.get(k) in (None, "") else str(r[k]) for k, _h in COLUMNS] for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
    said = set()
    for r in rows:
        if r.get("declared_reasons") and r["host"] not in said:
            said.add(r["host"])
            lines.append(f"{r['host']}: not as declared - " + "; ".join(r["declared_reasons"]))
        if r.get("message"):
            lines.append(f"{r['host']}{'/' + r['instance'] if r.get('instance') else ''}: {r['message']}")
    return lines + list(notes or [])
