// A reward-model version's page while it trains: polls its progress (JSON, only the steps it has not
// seen), updates status, step, epoch, loss and held-out pair accuracy, and draws the loss per step
// with held-out pair accuracy at each epoch's end. Stops polling once the training ends.
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("rm-live-config").textContent);
  var chart = document.getElementById("rm-chart");
  var seen = 0, points = [], delay = 2000;

  function text(id, value) {
    var node = document.getElementById(id);
    if (node) node.textContent = value;
  }

  function fixed(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  function draw(heldout) {
    if (!window.Plotly || !chart) return;
    var loss = { x: points.map(function (p) { return p.epoch; }), y: points.map(function (p) { return p.loss; }),
      name: "loss", mode: "lines", type: "scatter" };
    var held = { x: heldout.map(function (p) { return p.epoch; }), y: heldout.map(function (p) { return p.accuracy; }),
      name: "held-out pair accuracy", mode: "lines+markers", type: "scatter", yaxis: "y2" };
    var layout = { margin: { t: 10, r: 50, b: 40, l: 50 }, height: 260, xaxis: { title: "epoch" },
      yaxis: { title: "loss" }, yaxis2: { title: "accuracy", overlaying: "y", side: "right", range: [0, 1] },
      legend: { orientation: "h" } };
    window.Plotly.react(chart, [loss, held], layout, { displaylogo: false, responsive: true });
  }

  function show(progress) {
    points = points.concat(progress.history);
    if (progress.history.length) seen = progress.history[progress.history.length - 1].step;
    var badge = document.getElementById("version-status");
    if (badge) { badge.textContent = progress.status; badge.className = "badge status-" + progress.status; }
    text("version-steps", progress.step + " of " + progress.steps);
    text("progress-epoch", fixed(progress.epoch, 2) + " of " + progress.epochs);
    text("progress-loss", fixed(progress.loss, 4));
    var byEpoch = progress.heldout_accuracy_by_epoch;
    text("progress-heldout", byEpoch.length ? fixed(byEpoch[byEpoch.length - 1].accuracy, 3) : "–");
    text("progress-restarts", progress.restarts +
      (progress.checkpoint_step ? " (checkpoint at step " + progress.checkpoint_step + ")" : ""));
    draw(byEpoch);
  }

  function poll() {
    fetch(config.url + "?since=" + seen, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : Promise.reject(response.status); })
      .then(function (progress) {
        show(progress);
        if (progress.terminal) {
          if (!config.terminal) window.location.reload(); // the final accuracies and the runs that used it
          return;
        }
        window.setTimeout(poll, delay);
      })
      .catch(function () { window.setTimeout(poll, delay * 2); });
  }

  window.addEventListener("load", poll);
})();
