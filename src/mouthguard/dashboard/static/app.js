// The operator's page: everything comes from /api (the server's cached snapshot).
// Text from the store (run names, reasons) is only ever set as textContent, never as HTML.
"use strict";

const PAGE = 100;
const state = { offset: 0, total: 0, mutations: false };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "title") node.title = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function seconds(s) {
  if (s === null || s === undefined) return "";
  if (s < 1) return (s * 1000).toFixed(1) + " ms";
  if (s < 120) return s.toFixed(2) + " s";
  return (s / 60).toFixed(1) + " min";
}

function rate(bps) {
  return bps === null || bps === undefined ? "" : bytes(bps) + "/s";
}

function when(iso) {
  if (!iso) return "?";
  const d = new Date(iso);
  return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function showError(error) {
  const box = document.getElementById("error");
  box.hidden = !error;
  box.textContent = error ? String(error.message || error) : "";
}

function card(label, value, tone) {
  return el("div", { class: "card" + (tone ? " " + tone : ""), "data-card": label },
    el("div", { class: "value" }, value), el("div", { class: "label" }, label));
}

function tierCard(t) {
  // Name, domain, whether it answers, and (local tiers) free space.
  const c = card("tier " + t.name, t.domain + (t.fast ? " (fast)" : ""), t.health === "ok" ? "" : "bad");
  const free = t.free_bytes === null || t.free_bytes === undefined
    ? "" : bytes(t.free_bytes) + " free of " + bytes(t.total_bytes) + "; ";
  c.append(el("div", { class: "label", "data-tier-health": t.health }, free + t.health));
  return c;
}

function renderSummary(s) {
  document.getElementById("source").textContent = s.source;
  document.getElementById("freshness").textContent =
    "read " + when(s.taken_at) + " in " + seconds(s.build_seconds);
  const pending = s.pending.trash + s.pending.purge + s.pending.demote;
  const cards = document.getElementById("cards");
  cards.replaceChildren(
    card("checkpoints", s.checkpoints),
    card("protected", s.by_state.protected, "ok"),
    card("not yet protected", s.by_state.committed + s.by_state.verified,
      s.by_state.committed + s.by_state.verified ? "bad" : ""),
    card("unprotected bytes", bytes(s.unprotected_bytes), s.unprotected_bytes ? "bad" : ""),
    card("damaged", s.by_state.damaged, s.by_state.damaged ? "bad" : ""),
    card("in trash", s.by_state.trashed),
    card("pending copy deletions", pending),
    ...s.tiers.map((t) => tierCard(t)),
  );
  const runs = document.querySelector("#runs tbody");
  runs.replaceChildren(...s.runs.map((r) => el("tr", { "data-run": r.run },
    el("td", {}, r.run),
    el("td", { class: "num" }, r.checkpoints),
    el("td", { class: "num" }, bytes(r.nbytes)),
    el("td", { class: "num" }, r.newest_step),
    el("td", { class: "num" }, r.newest_protected_step === null ? "none" : r.newest_protected_step),
    el("td", { class: "num" }, r.held),
    el("td", { class: "num" }, r.damaged),
    el("td", { class: "num" }, r.last_save ? seconds(r.last_save.stall_seconds) : ""),
    el("td", { class: "num" }, r.last_save ? seconds(r.last_save.seconds) : ""),
  )));
  const select = document.querySelector("#filters select[name=run]");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "all"),
    ...s.runs.map((r) => el("option", { value: r.run }, r.run)));
  select.value = chosen;
  state.mutations = s.mutations;
  document.getElementById("token-box").hidden = !s.mutations;
  document.querySelector("th.actions-col").hidden = !s.mutations;
  document.getElementById("datasets-section").hidden = s.datasets === 0;
  document.getElementById("kvcache-section").hidden = s.kvcaches === 0;
  document.getElementById("peers-section").hidden = !s.peers;
}

function copyCell(copies) {
  return el("td", {}, ...copies.map((c) => {
    let cls = "copy";
    let title = "not verified";
    if (c.damage) { cls += " damaged"; title = "damaged: " + c.damage; }
    else if (c.verified) { cls += " verified"; title = "verified " + when(c.verified_at); }
    if (c.trashed_at) { cls += " trashed"; title += "; in trash since " + when(c.trashed_at); }
    return el("span", { class: cls, title: title, "data-tier": c.tier }, c.tier);
  }));
}

function stateCell(row) {
  const td = el("td", {}, el("span", { class: "state " + row.state, title: row.protection_missing.join("\n") }, row.state));
  if (row.held) td.append(" ", el("span", { class: "state held", title: row.holds.join(", ") }, "held"));
  // Suspect: intact bytes a resume skips. The reason is shown, not only hovered.
  if (row.suspect) {
    td.append(" ", el("span", { class: "state suspect" }, "suspect"),
      el("div", { class: "reason" }, row.suspect));
  }
  // The audit trail's latest act; hover for the last few (mouthguard audit has them all).
  const acts = row.acts || [];
  if (acts.length) {
    const all = acts.map((a) => when(a.time) + " " + a.act + " by " + a.actor + ": " + a.status
      + (a.reason ? " (" + a.reason + ")" : "")).join("\n");
    td.append(el("div", { class: "last-act", title: all }, "last: " + acts[0].act + " by " + acts[0].actor));
  }
  return td;
}

async function mutate(row, verb, body) {
  const token = document.getElementById("token").value;
  try {
    await api("/api/checkpoints/" + encodeURIComponent(row.run) + "/" + row.step + "/" + verb, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Authorization": "Bearer " + token },
      body: JSON.stringify(body),
    });
    await refresh();
  } catch (error) { showError(error); }
}

function actionsCell(row) {
  const hold = el("button", { class: "small", type: "button" }, "hold");
  hold.onclick = () => mutate(row, "hold", { name: "hold" });
  const release = el("button", { class: "small", type: "button" }, "release");
  release.onclick = () => mutate(row, "release", { name: "hold" });
  const promote = el("button", { class: "small", type: "button" }, "critical");
  promote.onclick = () => mutate(row, "importance", { level: "critical" });
  return el("td", {}, hold, " ", release, " ", promote);
}

function renderCheckpoints(page) {
  state.total = page.total;
  const body = document.querySelector("#checkpoints tbody");
  body.replaceChildren(...page.rows.map((r) => {
    const save = r.save || {};
    const tr = el("tr", { "data-run": r.run, "data-step": r.step, "data-state": r.state },
      el("td", {}, r.run),
      el("td", { class: "num" }, r.step),
      el("td", { class: "imp-" + r.importance }, r.importance || "?"),
      stateCell(r),
      copyCell(r.copies),
      el("td", { class: "num" }, bytes(r.nbytes)),
      el("td", { class: "num" }, seconds(save.stall_seconds)),
      el("td", { class: "num" }, seconds(save.seconds)),
      el("td", { class: "num" }, rate(save.bytes_per_second)),
      el("td", {}, when(r.created)),
      el("td", { class: "verdict-" + r.retention.verdict, title: r.retention.reasons.join("\n") },
        r.retention.verdict),
    );
    if (state.mutations) tr.append(actionsCell(r));
    return tr;
  }));
  const last = Math.min(page.offset + page.rows.length, page.total);
  document.getElementById("page-info").textContent =
    page.total ? (page.offset + 1) + "-" + last + " of " + page.total : "none";
  document.getElementById("prev").disabled = page.offset === 0;
  document.getElementById("next").disabled = last >= page.total;
}

function renderTimeline(t) {
  const box = document.getElementById("timeline");
  document.getElementById("timeline-run").textContent = t.run ? "run " + t.run : "";
  const saves = t.saves;
  if (!saves.length) { box.replaceChildren(el("p", { class: "muted" }, "no recorded saves")); return; }
  const ns = "http://www.w3.org/2000/svg";
  const W = 1000, H = 220, L = 60, B = 24, T = 10;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  svg.setAttribute("preserveAspectRatio", "none");
  const times = saves.map((s) => Date.parse(s.created));
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const top = Math.max(...saves.map((s) => s.seconds)) || 1;
  const span = Math.max(t1 - t0, 1);
  const width = Math.max(1, (W - L - 10) / saves.length * 0.7);
  const x = (ms) => L + (W - L - 10 - width) * (ms - t0) / span;
  const y = (s) => H - B - (H - B - T) * s / top;
  const shape = (tag, attrs) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  };
  svg.append(shape("line", { class: "axis", x1: L, y1: H - B, x2: W, y2: H - B }));
  svg.append(shape("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const label = (text, ax, ay, anchor) => {
    const node = shape("text", { x: ax, y: ay, "text-anchor": anchor || "start" });
    node.textContent = text;
    svg.append(node);
  };
  label(seconds(top), L - 4, T + 8, "end");
  label("0", L - 4, H - B, "end");
  // Saves within one second would get the same label: then show milliseconds.
  const first = saves[0].created, last = saves[saves.length - 1].created;
  const fine = when(first) === when(last) && t1 > t0;
  const stamp = (iso) => (fine ? new Date(iso).toISOString().replace("T", " ").slice(0, 23) + "Z" : when(iso));
  label(stamp(first), L, H - 6);
  if (t1 > t0) label(stamp(last), W - 10, H - 6, "end");
  saves.forEach((s, i) => {
    const left = x(times[i]);
    const bar = shape("rect", { class: "save", x: left, y: y(s.seconds), width: width, height: H - B - y(s.seconds), "data-step": s.step });
    const tip = document.createElementNS(ns, "title");
    tip.textContent = "step " + s.step + ": " + seconds(s.seconds) + " (" + s.mode + "), stall " + seconds(s.stall_seconds);
    bar.append(tip);
    svg.append(bar);
    svg.append(shape("rect", { class: "stall", x: left, y: y(s.stall_seconds), width: width, height: H - B - y(s.stall_seconds) }));
  });
  box.replaceChildren(svg);
}

function renderPending(p) {
  const body = document.querySelector("#pending tbody");
  if (!p.actions.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "nothing to do")));
    return;
  }
  body.replaceChildren(...p.actions.map((a) => el("tr", { "data-action": a.action },
    el("td", {}, a.run), el("td", { class: "num" }, a.step), el("td", {}, a.tier),
    el("td", { class: a.action === "restore" ? "" : "verdict-delete" }, a.action),
    el("td", {}, a.reason))));
  if (p.total_actions > p.actions.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "muted" },
      "... and " + (p.total_actions - p.actions.length) + " more (mouthguard gc lists all)")));
  }
}

function renderDatasets(rows) {
  document.querySelector("#datasets tbody").replaceChildren(...rows.map((d) => d.error
    ? el("tr", {}, el("td", {}, d.location), el("td", { colspan: 6, class: "error" }, d.error))
    : el("tr", { "data-dataset": d.name },
      el("td", {}, d.name), el("td", {}, d.kind + (d.layout === "indexed" ? " (adopted)" : "")),
      el("td", { class: "num" }, d.units), el("td", { class: "num" }, d.samples),
      el("td", { class: "num" }, bytes(d.nbytes)), el("td", {}, d.fingerprint.slice(0, 19)),
      el("td", {}, when(d.created)))));
}

// One row per node and step, as `mouthguard ls --peers` lists them; the state says whether
// the node holds the step complete and whether every rank's file is held on some node.
function peerState(p) {
  if (!p.complete) return "save in flight or interrupted (no manifest)";
  if (p.recoverable) return "complete: every rank held";
  if (p.missing === null) return "complete here; world size unknown";
  return "complete here; rank(s) " + p.missing.join(",") + " on no node";
}

function renderPeers(p) {
  document.getElementById("peers-summary").textContent = p.path + ": " + p.nodes +
    " node area(s), " + p.steps + " complete step(s), " + bytes(p.bytes) + " held";
  const body = document.querySelector("#peers tbody");
  if (!p.rows.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "nothing held")));
    return;
  }
  body.replaceChildren(...p.rows.map((r) => el("tr", {
    "data-node": r.node, "data-run": r.run, "data-step": r.step,
    "data-complete": String(r.complete), "data-recoverable": String(r.recoverable) },
  el("td", {}, r.node), el("td", {}, r.run), el("td", { class: "num" }, r.step),
  el("td", {}, r.ranks.join(",")), el("td", { class: "num" }, bytes(r.bytes)),
  el("td", { class: r.recoverable ? "" : "verdict-delete" }, peerState(r)))));
  if (p.total > p.rows.length) {
    body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" },
      "... and " + (p.total - p.rows.length) + " more (mouthguard ls --peers lists all)")));
  }
}

function renderKV(rows) {
  const ms = (v) => (v === null || v === undefined ? "" : v.toFixed(3));
  document.querySelector("#kvcache tbody").replaceChildren(...rows.map((k) => el("tr", {},
    el("td", {}, k.cache), el("td", {}, k.tier), el("td", { class: "num" }, k.blocks),
    el("td", { class: "num" }, bytes(k.bytes)), el("td", { class: "num" }, k.hits),
    el("td", { class: "num" }, k.misses), el("td", { class: "num" }, k.evictions),
    el("td", { class: "num" }, ms(k.get_p50_ms)), el("td", { class: "num" }, ms(k.get_p99_ms)))));
}

function query() {
  const params = new URLSearchParams({ offset: state.offset, limit: PAGE });
  for (const [key, value] of new FormData(document.getElementById("filters"))) {
    if (value) params.set(key, value);
  }
  return params;
}

async function loadCheckpoints() {
  renderCheckpoints(await api("/api/checkpoints?" + query()));
}

async function refresh() {
  try {
    const summary = await api("/api/summary");
    renderSummary(summary);
    const run = document.querySelector("#filters select[name=run]").value;
    const jobs = [
      loadCheckpoints(),
      api("/api/timeline" + (run ? "?run=" + encodeURIComponent(run) : "")).then(renderTimeline),
      api("/api/pending").then(renderPending),
    ];
    if (summary.datasets) jobs.push(api("/api/datasets").then(renderDatasets));
    if (summary.kvcaches) jobs.push(api("/api/kvcache").then(renderKV));
    if (summary.peers) jobs.push(api("/api/peers").then(renderPeers));
    await Promise.all(jobs);
    showError(null);
  } catch (error) {
    showError(error);
  }
  document.body.dataset.loaded = "true";
}

document.getElementById("filters").addEventListener("change", () => { state.offset = 0; refresh(); });
document.getElementById("prev").addEventListener("click", () => {
  state.offset = Math.max(0, state.offset - PAGE); loadCheckpoints().catch(showError);
});
document.getElementById("next").addEventListener("click", () => {
  state.offset += PAGE; loadCheckpoints().catch(showError);
});
refresh();
setInterval(refresh, 15000);
