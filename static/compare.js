// Compare runs: every metric of the runs overlaid, one chart a metric, each series downsampled
// server-side; smoothing, log scale and x-axis from the shared chart controls (charts.js).
(function () {
  "use strict";
  var node = document.getElementById("compare-config-data");
  if (!node) return;
  var config = JSON.parse(node.textContent);
  var COLOURS = ["#1f4fa8", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207", "#475569"];
  var loaded = []; // per run: {run, series: name -> {x, y}, axes}

  function load(run) {
    var url = run.metrics + "?max_points=" + config.max_points;
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : { metrics: [], axes: null }; })
      .then(function (body) {
        var series = {};
        body.metrics.forEach(function (m) {
          series[m.name] = { x: m.points.map(function (p) { return p.step; }), y: m.points.map(function (p) { return p.value; }) };
        });
        return { run: run, series: series, axes: body.axes };
      });
  }

  function slug(name) { return name.replace(/[^A-Za-z0-9_-]/g, "-"); }

  function draw() {
    var charts = window.flywheelCharts;
    var grid = document.getElementById("compare-charts");
    if (!grid || !charts || !window.Plotly) return;
    var group = null;
    (config.charts || config.names.map(function (n) { return { name: n, title: n, group: "" }; })).forEach(function (chart) {
      var name = chart.name;
      var id = "compare-" + slug(name);
      var plot = document.getElementById(id);
      if (!plot) {
        // Charts come grouped (reward, held-out, ...): a heading where a group starts.
        if (chart.group && chart.group !== group) {
          var heading = document.createElement("h3");
          heading.className = "chart-group";
          heading.textContent = chart.group;
          grid.appendChild(heading);
        }
        var made = charts.cell(id, chart.title);
        made.cell.dataset.metric = name;
        grid.appendChild(made.cell);
        charts.followSize(made.plot);
        plot = made.plot;
      }
      group = chart.group;
      var traces = [];
      loaded.forEach(function (entry, index) {
        var s = entry.series[name];
        if (!s) return;
        var at = charts.placed(s.x, s.y, entry.axes);
        // Held-out series are a few exact evaluations: drawn as they are, never smoothed.
        var heldout = name.indexOf("heldout/") === 0;
        traces.push({ name: entry.run.name + " #" + entry.run.id, x: at.x, y: at.y, mode: heldout ? "lines+markers" : "lines", meta: heldout ? "heldout" : undefined, line: { color: COLOURS[index % COLOURS.length] } });
      });
      var layout = charts.layoutFor({
        title: { text: chart.title, font: { size: 13 } },
        yaxis: chart.percent ? charts.percentAxis() : undefined,
        margin: { l: 45, r: 10, t: 30, b: 40 },
        height: plot.closest(".chart-full") ? Math.max(300, window.innerHeight - 90) : 270,
        showlegend: true,
        legend: { font: { size: 10 }, orientation: "h", x: 0, y: -0.34, yanchor: "top" },
        paper_bgcolor: "rgba(0,0,0,0)",
        plot_bgcolor: "rgba(0,0,0,0)",
        font: { color: getComputedStyle(document.body).color },
      });
      var shown = charts.smoothed(traces);
      window.Plotly.react(plot, shown, layout, { displaylogo: false, responsive: true });
      plot.dataset.points = String(charts.rawPoints(shown));
      plot.dataset.runs = String(traces.length);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!config.names.length) return;
    Promise.all(config.runs.map(load)).then(function (entries) {
      loaded = entries;
      draw();
      if (window.flywheelCharts) window.flywheelCharts.onChange(draw);
    });
  });
})();
