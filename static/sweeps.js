// A sweep's parallel-coordinates chart: one vertical axis per parameter and the objective last,
// each trial a line across them coloured by its objective. Drawn with scatter traces (the vendored
// plotly-basic bundle has no parcoords trace): each axis is scaled to [0, 1] and labelled with its
// own range, categories at their index.
(function () {
  "use strict";
  function scaled(dimension) {
    const values = dimension.values;
    if (dimension.ticktext) {
      const top = Math.max(1, dimension.ticktext.length - 1);
      return { points: values.map((v) => v / top), low: dimension.ticktext[0], high: dimension.ticktext[dimension.ticktext.length - 1] };
    }
    const low = Math.min(...values);
    const high = Math.max(...values);
    const span = high - low || 1;
    return { points: values.map((v) => (high === low ? 0.5 : (v - low) / span)), low: low.toPrecision(3), high: high.toPrecision(3) };
  }
  function colour(value, low, high) {
    const t = high === low ? 1 : (value - low) / (high - low);
    const r = Math.round(60 + 180 * (1 - t));
    const g = Math.round(90 + 110 * t);
    return `rgb(${r},${g},${Math.round(200 - 120 * t)})`;
  }
  function draw() {
    const node = document.getElementById("sweep-chart");
    const source = document.getElementById("sweep-chart-data");
    if (!node || !source || typeof Plotly === "undefined") return;
    const data = JSON.parse(source.textContent);
    if (!data.trials.length) return;
    const axes = data.dimensions.map(scaled);
    const low = Math.min(...data.color);
    const high = Math.max(...data.color);
    const x = data.dimensions.map((_, index) => index);
    const traces = data.trials.map((number, row) => ({
      x: x,
      y: axes.map((axis) => axis.points[row]),
      mode: "lines+markers",
      name: `trial ${number}`,
      line: { color: colour(data.color[row], low, high), width: 2 },
      hovertext: data.dimensions.map((d) => `${d.label}: ${d.ticktext ? d.ticktext[d.values[row]] : d.values[row]}`),
      hoverinfo: "text+name",
    }));
    const grid = getComputedStyle(document.documentElement).getPropertyValue("--chart-grid").trim() || "#e3e6eb";
    const annotations = axes.flatMap((axis, index) => [
      { x: index, y: 1.04, text: String(axis.high), showarrow: false, font: { size: 10 } },
      { x: index, y: -0.04, text: String(axis.low), showarrow: false, font: { size: 10 } },
    ]);
    Plotly.newPlot(
      node,
      traces,
      {
        margin: { t: 30, r: 30, b: 60, l: 30 },
        xaxis: { tickvals: x, ticktext: data.dimensions.map((d) => d.label), gridcolor: grid, zeroline: false },
        yaxis: { visible: false, range: [-0.1, 1.1] },
        annotations: annotations,
        showlegend: false,
        paper_bgcolor: "rgba(0,0,0,0)",
        plot_bgcolor: "rgba(0,0,0,0)",
        font: { color: getComputedStyle(document.body).color },
      },
      { displayModeBar: false, responsive: true }
    );
    node.dataset.trials = String(data.trials.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
