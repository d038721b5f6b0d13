// Compare runs: one metric of several runs overlaid, each series downsampled server-side.
(function () {
  "use strict";
  var node = document.getElementById("compare-config-data");
  if (!node) return;
  var config = JSON.parse(node.textContent);

  function load(run) {
    var url = run.metrics + "?name=" + encodeURIComponent(config.metric) + "&max_points=" + config.max_points;
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : { metrics: [] }; })
      .then(function (body) {
        var points = body.metrics.length ? body.metrics[0].points : [];
        return {
          name: run.name + " (#" + run.id + ")",
          x: points.map(function (p) { return p.step; }),
          y: points.map(function (p) { return p.value; }),
          mode: "lines",
        };
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var chart = document.getElementById("compare-chart");
    var select = document.getElementById("compare-metric");
    if (select) select.addEventListener("change", function () { select.form.submit(); });
    if (!config.metric || !window.Plotly) return;
    Promise.all(config.runs.map(load)).then(function (traces) {
      window.Plotly.react(chart, traces, {
        title: { text: config.metric, font: { size: 13 } },
        margin: { l: 50, r: 10, t: 30, b: 30 },
        height: 360,
        xaxis: { title: { text: "step" } },
      }, { displaylogo: false, responsive: true });
      chart.dataset.points = String(traces.reduce(function (s, t) { return s + t.x.length; }, 0));
    });
  });
})();
