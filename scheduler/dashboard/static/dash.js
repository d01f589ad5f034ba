// scheduler dashboard: live counts and charts by short polling (no page reload), the
// "select all" box and confirm prompts. Written for this project; no library. Every value
// from the server is set with textContent / SVG attributes, never as HTML.
"use strict";

(function () {
  const POLL_MS = 3000;
  const SVG = "http://www.w3.org/2000/svg";
  const base = document.body.dataset.base || "";
  const status = document.getElementById("live-status");

  function duration(ms) {
    if (ms === null || ms === undefined) return "-";
    ms = Math.abs(ms);
    if (ms < 1000) return ms + "ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
    const s = Math.floor(ms / 1000);
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + String(Math.floor((s % 86400) / 3600)).padStart(2, "0") + "h";
  }

  function fill(scope, data) {
    scope.querySelectorAll("[data-live]").forEach(function (el) {
      const v = data[el.dataset.live];
      if (v === undefined) return;
      el.textContent = el.dataset.format === "duration" ? duration(v) : String(v);
    });
  }

  function utc(ms) {  // as the pages show times (render.fmt_time): 2026-01-02 03:04:05 UTC
    if (!ms) return "an unknown time";  // 0: a stored value that is no time
    const d = new Date(ms);
    return isNaN(d.getTime()) ? String(ms) : d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  // A queue's pause (paused_ms: null while it is not): its badge, notice and buttons follow.
  // A partitioned queue is paused when any partition is; "partly" while not all of them are.
  function paused(scope, data) {
    if (!("paused_ms" in data)) return;
    const on = data.paused_ms !== null;
    const parts = data.partitions || [], stopped = data.paused_partitions || [];
    const partly = on && parts.length > 0 && stopped.length < parts.length;
    function hide(selector, yes) { scope.querySelectorAll(selector).forEach(function (e) { e.hidden = yes; }); }
    hide("[data-paused-show]", !on);
    hide("[data-paused-hide]", on && !partly);
    hide("[data-paused-whole]", partly);
    hide("[data-paused-partly]", !partly);
    if (!on) return;
    scope.querySelectorAll("[data-paused-count]").forEach(function (e) { e.textContent = String(stopped.length); });
    const since = utc(data.paused_ms);
    scope.querySelectorAll("[data-paused-since]").forEach(function (e) { e.textContent = since; });
    scope.querySelectorAll("[data-paused-title]").forEach(function (e) { e.title = "paused since " + since; });
  }

  // The held count (of the due ones) shows while flow control holds any: jobs held after the
  // page was drawn show too, and it goes once none is.
  function held(scope, data) {
    if (!("held" in data)) return;
    scope.querySelectorAll("[data-held-show]").forEach(function (e) { e.hidden = !(data.held > 0); });
    // Jobs a queue move holds (the queue page's `moving` card), the same way.
    scope.querySelectorAll("[data-moving-show]").forEach(function (e) { e.hidden = !(data.moving > 0); });
  }

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (parent) parent.appendChild(e);
    return e;
  }

  function path(values, w, h, top, pad) {
    let d = "";
    let pen = false;
    const step = values.length > 1 ? (w - pad) / (values.length - 1) : 0;
    values.forEach(function (v, i) {
      if (v === null || v === undefined) { pen = false; return; }
      const x = pad + i * step;
      const y = h - 14 - (top > 0 ? (v / top) * (h - 24) : 0);
      d += (pen ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1) + " ";
      pen = true;
    });
    return d.trim();
  }

  function dots(svg, s, w, h, top, pad) {
    // A dot per sample: a minute with a sample between two gaps is still seen.
    const step = s.values.length > 1 ? (w - pad) / (s.values.length - 1) : 0;
    s.values.forEach(function (v, i) {
      if (v === null || v === undefined) return;
      const y = h - 14 - (top > 0 ? (v / top) * (h - 24) : 0);
      const dot = el("circle", { cx: (pad + i * step).toFixed(1), cy: y.toFixed(1), r: 2.5, class: s.cls }, svg);
      const tip = document.createElementNS(SVG, "title");
      tip.textContent = duration(v);
      dot.appendChild(tip);
    });
  }

  function draw(svg, series, opts) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const w = Number(svg.getAttribute("width")), h = Number(svg.getAttribute("height"));
    const pad = opts.axis ? 54 : 2;
    let top = 0;
    series.forEach(function (s) { s.values.forEach(function (v) { if (v !== null && v > top) top = v; }); });
    if (opts.axis) {
      el("line", { x1: pad, y1: h - 14, x2: w, y2: h - 14, class: "axis" }, svg);
      el("line", { x1: pad, y1: 10, x2: pad, y2: h - 14, class: "axis" }, svg);
      const label = el("text", { x: 2, y: 16 }, svg);
      label.textContent = opts.format(top);
      const zero = el("text", { x: 2, y: h - 14 }, svg);
      zero.textContent = opts.format(0);
      const left = el("text", { x: pad, y: h - 2 }, svg);
      left.textContent = "-" + (opts.span || "60m");
      const right = el("text", { x: w - 24, y: h - 2 }, svg);
      right.textContent = "now";
    }
    series.forEach(function (s) {
      const d = path(s.values, w, h, top, pad);
      if (d) el("path", { d: d, class: s.cls }, svg);
      if (opts.axis) dots(svg, s, w, h, top, pad);
    });
  }

  function overview(data) {
    // A queue whose node did not answer this time keeps its last figures, greyed out.
    const read = new Set(data.queues.map(function (q) { return q.queue; }));
    document.querySelectorAll("#queues tr[data-queue]").forEach(function (row) {
      row.classList.toggle("stale", !read.has(row.dataset.queue));
    });
    if (status && data.unreachable && data.unreachable.length) status.dataset.partly = "1";
    else if (status) delete status.dataset.partly;
    data.queues.forEach(function (q) {
      const row = document.querySelector('tr[data-queue="' + CSS.escape(q.queue) + '"]');
      if (row) { fill(row, q); paused(row, q); held(row, q); }
      const spark = document.querySelector('svg[data-spark="' + CSS.escape(q.queue) + '"]');
      if (spark) draw(spark, [{ values: q.done, cls: "done" }, { values: q.failed, cls: "failed" }], {});
    });
    const chart = document.getElementById("lateness-chart");
    if (chart) {
      const span = duration(data.late_p99_ms.length * data.lateness_bucket_ms);
      draw(chart, [{ values: data.late_max_ms, cls: "late-max" }, { values: data.late_p99_ms, cls: "late" }],
        { axis: true, format: duration, span: span });
    }
  }

  // The pages' times are UTC, labelled (render.fmt_time): the refresh time too, not the browser's zone unlabelled.
  const CLOCK = new Intl.DateTimeFormat("en-GB", { timeZone: "UTC", timeZoneName: "short", hour: "2-digit", minute: "2-digit", second: "2-digit" });

  function poll(url, apply) {
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.json(); })
        .then(function (data) {
          apply(data);
          if (status) {
            status.textContent = (status.dataset.partly ? "partly unreadable · " : "live · ") + CLOCK.format(new Date());
            status.classList.toggle("off", Boolean(status.dataset.partly));
          }
        })
        .catch(function () { if (status) { status.textContent = "offline"; status.classList.add("off"); } })
        .finally(function () { window.setTimeout(tick, POLL_MS); });
    }
    tick();
  }

  if (document.getElementById("queues")) poll(base + "/api/overview" + window.location.search, overview);  // ?offset=: the same rows
  const cards = document.querySelector("[data-queue-api]");
  if (cards) poll(cards.dataset.queueApi, function (q) { fill(cards, q); paused(document, q); held(cards, q); });

  const all = document.getElementById("select-all");
  if (all) all.addEventListener("change", function () {
    document.querySelectorAll('input[name="ids"]').forEach(function (b) { b.checked = all.checked; });
  });
  document.querySelectorAll("form[data-confirm]").forEach(function (f) {
    f.addEventListener("submit", function (ev) { if (!window.confirm(f.dataset.confirm)) ev.preventDefault(); });
  });
})();
