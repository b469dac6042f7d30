"""The page served at / (see analyzer/web.py): plain HTML, CSS and JS, no
build step and nothing fetched from outside (clusters are often offline).
It polls /api/state every few seconds and redraws."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>netskel</title>
<style>
body{font:14px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse} td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
tr.open td{background:#fde8e8} .muted{color:#888}
svg .link{stroke:#9ab;stroke-width:1.5} svg .link.blamed{stroke:#d00;stroke-width:5}
svg .link.suspect{stroke:#d00;stroke-width:3;stroke-dasharray:6 4}
svg .switch{fill:#e8eef4;stroke:#567} svg .switch.blamed{fill:#f99;stroke:#d00;stroke-width:3}
svg .nic{fill:#fff;stroke:#567} svg text{font-size:10px}
.chart{display:inline-block;margin:4px 12px 4px 0;border:1px solid #ddd;padding:4px}
.chart .lat{fill:none;stroke:#36c;stroke-width:1.5} .chart .loss{fill:#d00;opacity:.6}
</style></head>
<body>
<h1>netskel <span id="status" class="muted">loading…</span></h1>
<h2>Incidents</h2>
<table><thead><tr><th>id</th><th>state</th><th>symptom</th><th>layer</th><th>component</th>
<th>pairs</th><th>confidence</th><th>since (UTC)</th></tr></thead><tbody id="incidents"></tbody></table>
<h2>Fabric <span class="muted">(blamed links and switches in red; dashed: links the probes
cannot tell from a blamed one)</span></h2>
<svg id="topology" width="1200" height="360"></svg>
<h2>Pairs of open incidents <span class="muted">(RTT median, smallest size; red: loss)</span></h2>
<div id="charts"></div>
<h2>Job skeleton</h2>
<div id="skeleton" class="muted">not available on this analyzer</div>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function cell(row, text) { const td = document.createElement("td"); td.textContent = text; row.appendChild(td); }
function utc(t) { return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19); }

function drawIncidents(incs) {
  const body = document.getElementById("incidents");
  body.replaceChildren();
  if (!incs.length) { const r = body.insertRow(); cell(r, "none"); return; }
  for (const i of incs) {
    const r = body.insertRow();
    r.className = "incident " + (i.end === null ? "open" : "closed");
    r.dataset.component = i.component.id;
    const twins = (i.evidence || {}).indistinguishable_from || [];
    for (const t of [i.id, i.end === null ? "open" : "closed", i.symptom, i.layer,
                     i.component.type + " " + i.component.id +
                       (twins.length ? " (or " + twins.join(", ") + ")" : ""),
                     String(i.pairs.length),
                     i.confidence.toFixed(2), utc(i.start)]) cell(r, t);
  }
}

function drawTopology(topo, blamed) {
  const svg = document.getElementById("topology");
  svg.replaceChildren();
  const W = +svg.getAttribute("width"), pos = {};
  const rows = {core: [], spine: [], tor: []};
  for (const s of topo.switches) (rows[s.tier] || rows.tor).push(s);
  const nics = topo.hosts.flatMap(h => h.nics.map(([id, rail]) => ({id, rail, host: h.id})));
  const place = (items, y) => items.forEach((it, k) => { pos[it.id] = [(k + 0.5) * W / items.length, y]; });
  place(rows.core, 20); place(rows.spine, 70);
  place(rows.tor.sort((a, b) => (a.rail - b.rail) || a.id.localeCompare(b.id)), 170);
  place(nics.sort((a, b) => (a.rail - b.rail) || a.host.localeCompare(b.host)), 300);
  const bl = new Set(blamed.links), bs = new Set(blamed.switches);
  const su = new Set(blamed.suspect_links || []);
  for (const l of topo.links) {
    if (!pos[l.a] || !pos[l.b]) continue;
    const [x1, y1] = pos[l.a], [x2, y2] = pos[l.b];
    const mark = bl.has(l.id) ? " blamed" : su.has(l.id) ? " suspect" : "";
    const line = el("line", {x1, y1, x2, y2, class: "link" + mark, "data-link": l.id});
    line.appendChild(el("title", {}, l.id));
    svg.appendChild(line);
  }
  for (const s of topo.switches) {
    const [x, y] = pos[s.id];
    svg.appendChild(el("rect", {x: x - 28, y: y - 10, width: 56, height: 20, rx: 3,
                                class: "switch" + (bs.has(s.id) ? " blamed" : ""), "data-switch": s.id}));
    svg.appendChild(el("text", {x, y: y + 4, "text-anchor": "middle"}, s.id));
  }
  for (const n of nics) {
    const [x, y] = pos[n.id];
    svg.appendChild(el("circle", {cx: x, cy: y, r: 6, class: "nic"}));
    svg.appendChild(el("text", {x, y: y + 20, "text-anchor": "middle"}, n.id));
  }
}

function drawCharts(charts) {
  const box = document.getElementById("charts");
  box.replaceChildren();
  if (!charts.length) { box.textContent = "no open incident"; box.className = "muted"; return; }
  box.className = "";
  for (const c of charts) {
    const div = document.createElement("div");
    div.className = "chart"; div.dataset.pair = c.pair.join(" ");
    // No windows kept for the pair (an incident restored after a restart).
    const size = c.points.length ? Math.min(...c.points.map(p => p.size)) : null;
    const pts = c.points.filter(p => p.size === size);
    const W = 360, H = 120, svg = el("svg", {width: W, height: H + 16});
    svg.appendChild(el("text", {x: 2, y: 10}, c.pair.join(" \u2194 ") +
                                            (size === null ? "  (no windows kept)" : "  (" + size + " B)")));
    if (pts.length) {
      const t0 = pts[0].t, t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
      const lat = pts.filter(p => p.median_us !== null);
      const top = Math.max(1, ...lat.map(p => p.median_us)) * 1.1;
      const X = t => 4 + (W - 8) * (t - t0) / (t1 - t0), Y = v => 16 + H - H * v / top;
      for (const p of c.points.filter(p => p.loss)) {  // loss at any size
        svg.appendChild(el("rect", {x: X(p.t) - 2, y: 16 + H - H * p.loss, width: 4, height: H * p.loss, class: "loss"}));
      }
      svg.appendChild(el("polyline", {class: "lat", points: lat.map(p => X(p.t) + "," + Y(p.median_us)).join(" ")}));
      svg.appendChild(el("text", {x: W - 4, y: 24, "text-anchor": "end"}, top.toFixed(0) + " us"));
    }
    div.appendChild(svg);
    box.appendChild(div);
  }
}

function drawSkeleton(sk) {
  const box = document.getElementById("skeleton");
  if (!sk || !sk.jobs || !sk.jobs.length) return;
  box.className = ""; box.replaceChildren();
  for (const j of sk.jobs) {
    const p = document.createElement("p");
    p.className = "job"; p.dataset.job = j.job;
    p.textContent = `${j.job}: ${j.status}` + (j.dp ? `, dp=${j.dp} tp=${j.tp} pp=${j.pp}, confidence ${j.confidence}` : "") +
      `, ${j.ping_pairs} probed pairs` + (j.notes && j.notes.length ? ` (${j.notes.join("; ")})` : "");
    box.appendChild(p);
    const t = document.createElement("table");
    (j.dp_groups || []).forEach((g, k) => { const r = t.insertRow(); cell(r, "DP group " + k); cell(r, g.join(", ")); });
    box.appendChild(t);
  }
}

async function refresh() {
  try {
    const r = await fetch("/api/state", {cache: "no-store"});
    const s = await r.json();
    drawIncidents(s.incidents); drawTopology(s.topology, s.blamed); drawCharts(s.charts); drawSkeleton(s.skeleton);
    const open = s.incidents.filter(i => i.end === null).length;
    document.getElementById("status").textContent = `${open} open incident(s), as of ${utc(s.now)} UTC`;
    document.body.dataset.ready = "1";
  } catch (e) {
    document.getElementById("status").textContent = "cannot reach the analyzer: " + e;
  }
}
refresh();
setInterval(refresh, 3000);
</script>
</body></html>
"""
