// What the run page and the compare page share about charts: the controls (smoothing, log scale,
// x-axis), exponential-moving-average smoothing drawn over the raw series left faint behind, and
// a full-screen view per chart. The controls' values are kept in localStorage.
(function () {
  "use strict";

  var STORE = "flywheel.charts";
  var listeners = [];
  var state = { smoothing: 0, log: false, x: "step" };
  try {
    var saved = JSON.parse(window.localStorage.getItem(STORE) || "{}");
    if (typeof saved.smoothing === "number") state.smoothing = Math.max(0, Math.min(0.99, saved.smoothing));
    if (typeof saved.log === "boolean") state.log = saved.log;
    if (["step", "wall", "tokens"].indexOf(saved.x) !== -1) state.x = saved.x;
  } catch (error) { /* storage off: defaults */ }

  function save() {
    try { window.localStorage.setItem(STORE, JSON.stringify(state)); } catch (error) { /* ignore */ }
  }

  // TensorBoard's debiased EMA: early points are not dragged towards 0.
  function ema(values, weight) {
    var out = [], last = 0, count = 0;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (v === null || v === undefined || !isFinite(v)) { out.push(null); continue; }
      last = last * weight + (1 - weight) * v;
      count += 1;
      out.push(last / (1 - Math.pow(weight, count)));
    }
    return out;
  }

  // Line traces get a smoothed copy in front; the raw one stays, faint. Bands, bars and held-out
  // series (meta "heldout": a few exact evaluations, which an EMA would pull off their values)
  // are kept as they are.
  function smoothed(traces) {
    if (!(state.smoothing > 0)) return traces;
    var out = [];
    traces.forEach(function (trace) {
      var line = (trace.mode || "lines").indexOf("lines") !== -1 && !trace.fill && !trace.stackgroup && trace.meta !== "band" && trace.meta !== "heldout";
      if (!line) { out.push(trace); return; }
      var raw = Object.assign({}, trace, { opacity: 0.25, showlegend: false, hoverinfo: "skip", meta: "raw" });
      delete raw.error_y;
      var smooth = Object.assign({}, trace, { y: ema(trace.y, state.smoothing), name: trace.name + " (smoothed)", meta: "smoothed" });
      if (raw.line) raw.line = Object.assign({}, raw.line);
      out.push(raw, smooth);
    });
    return out;
  }

  var X_TITLES = { step: "step", wall: "wall time (s)", tokens: "tokens learned from" };

  // Steps re-placed on the chosen x-axis; steps the axis has no value for are left out.
  function placed(xs, ys, axes) {
    if (state.x === "step" || !axes) return { x: xs, y: ys };
    var table = state.x === "wall" ? axes.wall_seconds : axes.tokens;
    var x = [], y = [];
    xs.forEach(function (step, i) {
      var value = table ? table[String(step)] : undefined;
      if (value !== undefined) { x.push(value); y.push(ys[i]); }
    });
    return { x: x, y: y };
  }

  // Grid lines and text from the page's theme (light or dark, as the system says).
  function themed() {
    var style = getComputedStyle(document.documentElement);
    var grid = style.getPropertyValue("--chart-grid").trim() || "#e3e6eb";
    return { grid: grid, text: getComputedStyle(document.body).color };
  }

  // A fraction's axis: 0 to 100 %, round ticks (never 0.438 / 0.728 / 1.018).
  function percentAxis() {
    return { range: [0, 1.02], tickformat: ".0%", tick0: 0, dtick: 0.25, fixedrange: false, meta: "percent" };
  }

  function layoutFor(base) {
    var theme = themed();
    var layout = Object.assign({}, base, { paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: theme.text } });
    // The title starts on the left, clear of the full-screen button on the right.
    if (base.title) layout.title = Object.assign({ x: 0, xanchor: "left", xref: "paper" }, base.title);
    layout.xaxis = Object.assign({}, base.xaxis || {}, { title: { text: X_TITLES[state.x] }, gridcolor: theme.grid, zerolinecolor: theme.grid });
    layout.yaxis = Object.assign({}, base.yaxis || {}, { type: state.log ? "log" : "linear", gridcolor: theme.grid, zerolinecolor: theme.grid });
    if (base.yaxis2) layout.yaxis2 = Object.assign({}, base.yaxis2, { gridcolor: theme.grid });
    // A percent axis on a log scale: the range and ticks no longer fit; the format stays.
    ["yaxis", "yaxis2"].forEach(function (key) {
      var axis = layout[key];
      if (axis && axis.meta === "percent" && state.log) { delete axis.range; delete axis.dtick; delete axis.tick0; }
    });
    return layout;
  }

  // A cell of the chart grid: a full-screen toggle above the plot.
  function cell(id, title) {
    var wrap = document.createElement("div");
    wrap.className = "chart-cell";
    wrap.dataset.chart = id;
    var bar = document.createElement("div");
    bar.className = "chart-bar";
    var button = document.createElement("button");
    button.type = "button";
    button.className = "btn btn-ghost btn-small chart-full-toggle";
    button.textContent = "Full screen";
    button.setAttribute("aria-label", "Full screen: " + title);
    button.addEventListener("click", function () { toggleFull(wrap); });
    bar.appendChild(button);
    wrap.appendChild(bar);
    var node = document.createElement("div");
    node.className = "chart";
    node.id = id;
    node.dataset.points = "0";
    wrap.appendChild(node);
    return { cell: wrap, plot: node };
  }

  function toggleFull(wrap) {
    var full = !wrap.classList.contains("chart-full");
    document.querySelectorAll(".chart-cell.chart-full").forEach(function (other) { setFull(other, false); });
    setFull(wrap, full);
  }

  function setFull(wrap, full) {
    wrap.classList.toggle("chart-full", full);
    document.body.classList.toggle("has-full-chart", Boolean(document.querySelector(".chart-cell.chart-full")));
    var button = wrap.querySelector(".chart-full-toggle");
    if (button) button.textContent = full ? "Exit full screen" : "Full screen";
    listeners.forEach(function (listener) { listener(state); }); // redrawn at the new height
  }

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") return;
    document.querySelectorAll(".chart-cell.chart-full").forEach(function (wrap) { setFull(wrap, false); });
  });

  // Plotly's `responsive` follows the window only; a cell can change size on its own.
  function followSize(node) {
    if (!("ResizeObserver" in window)) return;
    new window.ResizeObserver(function () {
      if (window.Plotly && node.data) window.Plotly.Plots.resize(node);
    }).observe(node);
  }

  function bindControls() {
    var smoothing = document.getElementById("chart-smoothing");
    var shown = document.getElementById("chart-smoothing-value");
    var log = document.getElementById("chart-log");
    var x = document.getElementById("chart-x");
    function changed() {
      save();
      if (shown) shown.textContent = state.smoothing.toFixed(2);
      listeners.forEach(function (listener) { listener(state); });
    }
    if (smoothing) {
      smoothing.value = String(state.smoothing);
      smoothing.addEventListener("input", function () { state.smoothing = Number(smoothing.value) || 0; changed(); });
    }
    if (shown) shown.textContent = state.smoothing.toFixed(2);
    if (log) {
      log.checked = state.log;
      log.addEventListener("change", function () { state.log = log.checked; changed(); });
    }
    if (x) {
      x.value = state.x;
      x.addEventListener("change", function () { state.x = x.value; changed(); });
    }
  }

  document.addEventListener("DOMContentLoaded", bindControls);

  window.flywheelCharts = {
    state: function () { return state; },
    percentAxis: percentAxis,
    onChange: function (listener) { listeners.push(listener); },
    ema: ema,
    smoothed: smoothed,
    placed: placed,
    layoutFor: layoutFor,
    cell: cell,
    followSize: followSize,
    rawPoints: function (traces) {
      return traces.reduce(function (sum, t) { return t.meta === "smoothed" ? sum : sum + t.x.length; }, 0);
    },
  };
})();
