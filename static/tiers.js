// The capability/speed chart of a tier evaluation: pass rate against tokens/s, Pareto front joined.
(function () {
  "use strict";
  function draw() {
    const node = document.getElementById("tier-chart");
    const source = document.getElementById("tier-chart-data");
    if (!node || !source || typeof Plotly === "undefined") return;
    const data = JSON.parse(source.textContent);
    if (!data.points.length) return;
    const others = data.points.filter((p) => !p.pareto);
    const front = data.front;
    const traces = [
      {
        x: others.map((p) => p.tokens_per_second),
        y: others.map((p) => p.pass_rate),
        text: others.map((p) => p.name),
        mode: "markers+text",
        textposition: "top center",
        name: "tiers",
        marker: { size: 10, color: "#9aa5b1" },
      },
      {
        x: front.map((p) => p.tokens_per_second),
        y: front.map((p) => p.pass_rate),
        text: front.map((p) => p.name),
        mode: "lines+markers+text",
        textposition: "top center",
        name: "Pareto front",
        line: { color: "#d9480f", width: 2 },
        marker: { size: 13, color: "#d9480f" },
      },
    ];
    // Text and grid from the page's theme (light or dark).
    const grid = getComputedStyle(document.documentElement).getPropertyValue("--chart-grid").trim() || "#e3e6eb";
    Plotly.newPlot(
      node,
      traces,
      {
        margin: { t: 20, r: 20, b: 50, l: 60 },
        xaxis: { title: { text: "tokens / s" }, rangemode: "tozero", gridcolor: grid },
        yaxis: { title: { text: "pass rate" }, range: [0, 1.05], gridcolor: grid },
        legend: { orientation: "h" },
        paper_bgcolor: "rgba(0,0,0,0)",
        plot_bgcolor: "rgba(0,0,0,0)",
        font: { color: getComputedStyle(document.body).color },
      },
      { displayModeBar: false, responsive: true }
    );
    node.dataset.points = String(data.points.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
