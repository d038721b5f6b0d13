// The live run page and the trajectory browser: Plotly charts fed by the run's websocket, live
// status, events, alerts and new trajectories. Websocket messages are notifications: on every
// (re)connect the page re-fetches over REST (metrics downsampled server-side, events ?since=),
// so nothing is missed. Text from the server is inserted with textContent, never as HTML.
(function () {
  "use strict";

  var configNode = document.getElementById("live-config");
  if (!configNode) return;
  var config = JSON.parse(configNode.textContent);

  // Which metrics each chart shows. A chart with no series stays hidden (entropy, for one,
  // is only there when the learner reports it).
  var CHARTS = [
    { id: "reward", title: "Reward (mean, min–max band, ± std)", match: function (n) { return n === "reward/mean"; } },
    { id: "components", title: "Sub-rewards (train, and held-out per grader)", match: function (n) { return /^(heldout\/)?reward\//.test(n) && !/^reward\/(mean|std|min|max)$/.test(n); } },
    { id: "pass-rate", title: "Pass rate (train and held-out)", percent: true, match: function (n) { return n === "train/pass_rate" || /^heldout\/pass_rate/.test(n); } },
    { id: "kl", title: "KL", match: function (n) { return n === "learner/kl"; } },
    { id: "entropy", title: "Entropy", match: function (n) { return n === "learner/entropy"; } },
    { id: "mismatch", title: "Decoder vs learner log-probs (KL, mean |Δ log p|, share of tokens apart)", match: function (n) { return n === "learner/mismatch_kl" || n === "learner/logprob_gap" || n === "learner/mismatch_tokens"; } },
    { id: "loss", title: "Loss and clip fraction", match: function (n) { return n === "learner/loss" || n === "learner/clip_fraction"; } },
    { id: "response-length", title: "Response length (tokens)", match: function (n) { return n === "episodes/response_tokens"; } },
    { id: "errored", title: "Errored-episode rate", percent: true, match: function (n) { return n === "episodes/errored_rate"; } },
    { id: "staleness", title: "Staleness (policy versions)", match: function (n) { return n === "episodes/staleness"; } },
    { id: "dropped", title: "Dropped episodes", match: function (n) { return /^dropped\//.test(n); } },
    { id: "time", title: "Time split (s)", match: function (n) { return /^time\//.test(n); }, stacked: true },
    { id: "throughput", title: "Tokens/s", match: function (n) { return n === "throughput/tokens_per_s"; } },
    { id: "mfu", title: "Learner model FLOPs utilisation (MFU)", percent: true, match: function (n) { return n === "learner/mfu"; } },
    { id: "learner-memory", title: "Learner peak memory per step (MiB)", match: function (n) { return n === "learner/peak_memory_mb"; } },
  ];
  var OTHER = { id: "other", title: "Other metrics", match: function () { return true; } };
  var BAND = { "reward/min": true, "reward/max": true, "reward/std": true, "heldout/reward": true };

  var series = {}; // name -> {x: [], y: []}
  var lastEventId = config.last_event || 0;
  var lastTrajectoryId = config.last_trajectory || 0;
  var lastStep = null;
  var dirty = {};
  var drawScheduled = false;
  var status = document.getElementById("live-status");

  function setLive(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    });
  }

  // --- charts ---------------------------------------------------------------------------------

  function chartFor(name) {
    if (BAND[name]) return CHARTS[0];
    for (var i = 0; i < CHARTS.length; i++) if (CHARTS[i].match(name)) return CHARTS[i];
    return OTHER;
  }

  var charts = window.flywheelCharts;
  var axes = null; // step -> wall seconds / tokens, from the metrics endpoint

  function chartNode(chart) {
    var node = document.getElementById("chart-" + chart.id);
    if (node) return node;
    var container = document.getElementById("charts");
    if (!container || !charts) return null;
    var made = charts.cell("chart-" + chart.id, chart.title);
    // Keep the charts in their declared order.
    var order = CHARTS.concat([OTHER]).map(function (c) { return c.id; });
    var mine = order.indexOf(chart.id);
    var before = null;
    Array.prototype.forEach.call(container.children, function (child) {
      if (!before && order.indexOf((child.dataset.chart || "").replace("chart-", "")) > mine) before = child;
    });
    container.insertBefore(made.cell, before);
    // Plotly's `responsive` follows the window only: a chart laid out while alone in the grid
    // keeps the full width when a second chart halves its cell. Follow the cell instead.
    charts.followSize(made.plot);
    var empty = document.getElementById("charts-empty");
    if (empty) empty.hidden = true;
    return made.plot;
  }

  // Held-out series are a few evaluations, each an exact figure: drawn as measured (markers and
  // lines, never smoothed), so a last evaluation of 1.0 reads 1.0 whatever the smoothing.
  var HELDOUT = { mode: "lines+markers", meta: "heldout" };

  function line(name, s, extra) {
    var at = charts ? charts.placed(s.x, s.y, axes) : s;
    var held = /^heldout\//.test(name) ? HELDOUT : {};
    return Object.assign({ name: name, x: at.x, y: at.y, mode: "lines" }, held, extra || {});
  }

  function traces(chart) {
    var names = Object.keys(series).filter(function (n) { return chartFor(n) === chart; }).sort();
    if (chart.id === "reward") {
      var out = [];
      if (series["reward/max"] && series["reward/min"]) {
        out.push(line("max", series["reward/max"], { line: { width: 0.5, color: "#9db7e0" }, meta: "band" }));
        out.push(line("min", series["reward/min"], { fill: "tonexty", fillcolor: "rgba(60,110,200,0.15)", line: { width: 0.5, color: "#9db7e0" }, meta: "band" }));
      }
      if (series["reward/mean"]) {
        var std = {};
        if (series["reward/std"]) series["reward/std"].x.forEach(function (step, i) { std[step] = series["reward/std"].y[i]; });
        var mean = series["reward/mean"];
        var trace = line("mean", mean, { line: { color: "#1f4fa8" } });
        if (series["reward/std"] && (!charts || charts.state().x === "step")) {
          trace.error_y = { type: "data", array: mean.x.map(function (s) { return std[s] || 0; }), visible: true, thickness: 0.5, width: 0, color: "#7d9bd4" };
        }
        out.push(trace);
      }
      // Held-out reward is measured on other items, less often: its own axis, on the right.
      if (series["heldout/reward"]) {
        out.push(line("held-out", series["heldout/reward"], { yaxis: "y2", mode: "lines+markers", meta: "heldout", line: { color: "#c2410c", dash: "dot" } }));
      }
      return out;
    }
    return names.map(function (n) {
      var trace = line(n, series[n]);
      if (chart.stacked) trace.stackgroup = "time";
      return trace;
    });
  }

  function withinUnit(s) {
    return Boolean(s && s.y.length) && s.y.every(function (v) { return v === null || (v >= 0 && v <= 1); });
  }

  function draw(chart) {
    var data = traces(chart);
    if (!data.length || !window.Plotly) return;
    var node = chartNode(chart);
    if (!node) return;
    var base = {
      title: { text: chart.title, font: { size: 13 } },
      margin: { l: 45, r: 10, t: 30, b: 40 },
      height: node.closest(".chart-full") ? Math.max(300, window.innerHeight - 90) : (data.length > 1 ? 270 : 240),
      showlegend: data.length > 1,
      legend: { font: { size: 10 }, orientation: "h", x: 0, y: -0.34, yanchor: "top" },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: getComputedStyle(document.body).color },
    };
    if (data.some(function (t) { return t.yaxis === "y2"; })) {
      base.yaxis2 = { title: { text: "held-out", font: { size: 11 } }, overlaying: "y", side: "right", showgrid: false };
      // Held-out reward of 0 to 1 (pass or fail items) reads as a percent, with round ticks.
      if (charts && withinUnit(series["heldout/reward"])) base.yaxis2 = Object.assign(base.yaxis2, charts.percentAxis());
      base.margin.r = 50;
    }
    if (chart.percent && charts) base.yaxis = charts.percentAxis();
    var layout = charts ? charts.layoutFor(base) : base;
    if (layout.yaxis2 && charts && charts.state().log) layout.yaxis2.type = "log";
    var shown = charts ? charts.smoothed(data) : data;
    window.Plotly.react(node, shown, layout, { displaylogo: false, responsive: true });
    node.dataset.points = String(charts ? charts.rawPoints(shown) : data.length);
    if (charts) {
      var state = charts.state();
      node.dataset.smoothing = String(state.smoothing);
      node.dataset.yscale = state.log ? "log" : "linear";
      node.dataset.x = state.x;
    }
  }

  function scheduleDraw(chart) {
    dirty[chart.id] = chart;
    if (drawScheduled) return;
    drawScheduled = true;
    // At most one redraw a frame whatever the message rate: the page stays responsive.
    window.requestAnimationFrame(function () {
      drawScheduled = false;
      var charts = dirty;
      dirty = {};
      Object.keys(charts).forEach(function (id) { draw(charts[id]); });
    });
  }

  function setStep(step) {
    if (lastStep === null || step > lastStep) lastStep = step;
    var node = document.getElementById("metric-step");
    if (node) node.textContent = String(lastStep);
    var learner = document.getElementById("learner-step");
    if (learner && lastStep !== null) learner.textContent = String(lastStep);
  }

  function appendPoint(name, step, value) {
    var s = series[name] || (series[name] = { x: [], y: [] });
    var n = s.x.length;
    if (n && s.x[n - 1] === step) s.y[n - 1] = value;
    else if (!n || s.x[n - 1] < step) { s.x.push(step); s.y.push(value); }
    else return; // an older step: the next re-fetch has it in place
    if (s.x.length > 2 * config.max_points) needsRefetch();
    if (charts && charts.state().x !== "step") needsRefetch(); // the new step's place comes with the axes
    scheduleDraw(chartFor(name));
  }

  var refetchTimer = null;
  function needsRefetch() {
    if (refetchTimer) return;
    refetchTimer = window.setTimeout(function () { refetchTimer = null; loadMetrics(); }, 2000);
  }

  function loadMetrics() {
    if (!config.metrics) return Promise.resolve();
    return getJSON(config.metrics + "?max_points=" + config.max_points).then(function (body) {
      if (body.axes) axes = body.axes;
      var fresh = {};
      body.metrics.forEach(function (m) {
        fresh[m.name] = { x: m.points.map(function (p) { return p.step; }), y: m.points.map(function (p) { return p.value; }) };
        if (m.points.length) setStep(m.points[m.points.length - 1].step);
      });
      // Points that arrived over the websocket while this request ran are kept.
      Object.keys(series).forEach(function (name) {
        var old = series[name], now = fresh[name];
        if (!now) { fresh[name] = old; return; }
        var last = now.x.length ? now.x[now.x.length - 1] : -1;
        old.x.forEach(function (step, i) { if (step > last) { now.x.push(step); now.y.push(old.y[i]); } });
      });
      series = fresh;
      CHARTS.concat([OTHER]).forEach(function (chart) { scheduleDraw(chart); });
    });
  }

  // --- events, alerts, status -------------------------------------------------------------

  function cell(text, className) {
    var td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }

  function badge(text, className) {
    var span = document.createElement("span");
    span.className = "badge " + className;
    span.textContent = text;
    return span;
  }

  // Times read as "12 s ago" and keep ticking; the exact time is in the title.
  function relative(date) {
    var seconds = Math.max(0, Math.round((Date.now() - date.getTime()) / 1000));
    if (seconds < 5) return "just now";
    if (seconds < 60) return seconds + " s ago";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h ago";
    return date.toISOString().replace("T", " ").slice(0, 16);
  }

  function timeNode(date) {
    var node = document.createElement("time");
    node.dateTime = date.toISOString();
    node.title = date.toISOString().replace("T", " ").slice(0, 19) + " UTC";
    node.dataset.relative = "";
    node.textContent = relative(date);
    return node;
  }

  function tickTimes() {
    document.querySelectorAll("time[data-relative]").forEach(function (node) {
      var date = new Date(node.getAttribute("datetime"));
      if (!isNaN(date.getTime())) node.textContent = relative(date);
    });
  }

  function addEvent(event) {
    if (!event || !event.id || event.id <= lastEventId) return;
    lastEventId = event.id;
    var body = document.getElementById("events-body");
    if (body) {
      var table = document.getElementById("events");
      if (table) table.hidden = false;
      var empty = document.getElementById("events-empty");
      if (empty) empty.hidden = true;
      var row = document.createElement("tr");
      row.dataset.event = String(event.id);
      var when = document.createElement("td");
      when.className = "muted small";
      when.appendChild(timeNode(event.created_at ? new Date(event.created_at) : new Date()));
      row.appendChild(when);
      var level = document.createElement("td");
      level.appendChild(badge(event.level, "level-" + event.level));
      row.appendChild(level);
      var message = cell(event.message + " ");
      var kind = document.createElement("span");
      kind.className = "muted small";
      kind.textContent = event.kind;
      message.appendChild(kind);
      row.appendChild(message);
      body.insertBefore(row, body.firstChild);
    }
    if (event.kind === "alert") addAlert(event);
    if (event.kind === "checkpoint") refreshSections().catch(function () {});
  }

  function addAlert(event) {
    var list = document.getElementById("alerts");
    if (!list) return;
    var item = document.createElement("li");
    item.className = "alert";
    item.dataset.event = String(event.id);
    var monitor = (event.data && event.data.monitor) || "alert";
    item.appendChild(badge(monitor, "level-warning"));
    var text = document.createElement("span");
    text.className = "alert-message";
    text.textContent = " " + event.message;
    item.appendChild(text);
    // A hacking alert links to the trajectories it groups, as the server-rendered list does.
    var ids = (event.data && event.data.evidence && event.data.evidence.trajectories) || [];
    if (ids.length) {
      var links = document.createElement("span");
      links.className = "alert-links small";
      ids.slice(0, 12).forEach(function (id) {
        var link = document.createElement("a");
        link.href = "/trajectories/" + Number(id) + "/";
        link.textContent = "#" + Number(id);
        links.appendChild(document.createTextNode(" "));
        links.appendChild(link);
      });
      item.appendChild(links);
    }
    list.insertBefore(item, list.firstChild);
    var empty = document.getElementById("alerts-empty");
    if (empty) empty.hidden = true;
  }

  function loadEvents(url) {
    if (!config.events) return Promise.resolve();
    return getJSON(url || config.events + "?since=" + lastEventId).then(function (page) {
      page.results.forEach(addEvent);
      if (page.next) return loadEvents(page.next);
    });
  }

  function setStatus(value) {
    var node = document.getElementById("run-status");
    if (!node || !value) return;
    node.textContent = value;
    node.className = "badge status-" + value;
    // The buttons follow the status at once (no Resume on a queued run while the page re-renders).
    if (config.actions) {
      document.querySelectorAll("#run-actions [data-action]").forEach(function (button) {
        var allowed = config.actions[button.dataset.action];
        if (!allowed) return;
        var form = button.closest("form") || button;
        form.hidden = allowed.indexOf(value) < 0;
      });
    }
  }

  // The parts of the run page that follow the run (actions, progress, checkpoints, error) are
  // re-rendered by the server, already escaped, and swapped in whenever the run changes.
  var FOLLOWED = ["run-actions", "run-progress", "run-error", "checkpoints-card", "metrics-card", "train-on-reviews"];
  var shown = config.shown || null;
  var sectionsLoading = false;
  var sectionsAgain = false;
  function refreshSections() {
    if (!document.getElementById("run-progress")) return Promise.resolve();
    if (sectionsLoading) { sectionsAgain = true; return Promise.resolve(); }
    sectionsLoading = true;
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        FOLLOWED.forEach(function (id) {
          var now = document.getElementById(id), next = fresh.getElementById(id);
          if (now && next) now.replaceWith(document.importNode(next, true));
          else if (!now && next && id === "run-actions") {
            var head = document.querySelector(".page-head");
            if (head) head.appendChild(document.importNode(next, true));
          }
          else if (now && !next) now.remove();
          else if (!now && next && id === "run-error") {
            var progress = document.getElementById("run-progress");
            if (progress) progress.parentNode.insertBefore(document.importNode(next, true), progress);
          }
        });
        tickTimes();
      })
      .finally(function () {
        sectionsLoading = false;
        if (sectionsAgain) { sectionsAgain = false; refreshSections().catch(function () {}); }
      });
  }

  // New metrics re-render the metrics table and the progress, at most once every 2 s.
  var sectionsTimer = null;
  function sectionsSoon() {
    if (sectionsTimer) return;
    sectionsTimer = window.setTimeout(function () {
      sectionsTimer = null;
      refreshSections().catch(function () {});
    }, 2000);
  }

  function followRun(run) {
    var cpu = run.progress.sandbox_cpu_seconds;
    var key = [run.status, run.progress.learner_step, run.progress.policy_version, Number.isInteger(cpu) ? cpu.toFixed(1) : cpu].join("|");
    if (shown === null) { shown = key; return; }
    if (key === shown) return;
    var statusChanged = shown.split("|")[0] !== run.status;
    shown = key;
    // A flash about the change just made ("queued", "paused") is stale once the run moves on.
    if (statusChanged) document.querySelectorAll(".messages").forEach(function (node) { node.remove(); });
    refreshSections().catch(function () {});
  }

  function loadDetail() {
    if (!config.detail) return Promise.resolve();
    return getJSON(config.detail).then(function (run) {
      setStatus(run.status);
      if (run.progress) followRun(run);
      var version = document.getElementById("policy-version");
      if (version) version.textContent = String(run.progress.policy_version);
      var learner = document.getElementById("learner-step");
      if (learner) learner.textContent = String(run.progress.learner_step);
    });
  }

  // --- trajectories as they finish --------------------------------------------------------

  // A new row of the trajectory browser, in its columns (a selection box when the table has one).
  function trajectoryRow(t, bulk) {
    var row = document.createElement("tr");
    row.dataset.trajectory = String(t.id);
    row.className = "fresh";
    if (bulk) {
      var pick = document.createElement("td");
      pick.className = "select-col";
      var box = document.createElement("input");
      box.type = "checkbox";
      box.name = "trajectory";
      box.value = String(t.id);
      box.setAttribute("aria-label", "Select trajectory " + t.id);
      pick.appendChild(box);
      row.appendChild(pick);
    }
    var first = document.createElement("td");
    var link = document.createElement("a");
    link.href = config.trajectory_page.replace("{id}", String(t.id));
    link.textContent = String(t.id);
    first.appendChild(link);
    row.appendChild(first);
    var outcome = document.createElement("td");
    outcome.appendChild(badge(t.outcome, "outcome-" + t.outcome));
    row.appendChild(outcome);
    row.appendChild(cell(t.reward === null ? "—" : String(t.reward), "num"));
    var item = document.createElement("td");
    var code = document.createElement("code");
    code.textContent = t.item_external_id;
    item.appendChild(code);
    row.appendChild(item);
    var prompt = t.prompt_preview || "";
    var skip = config.preview_skip || 0;
    if (skip && prompt.length > skip) prompt = "…" + prompt.slice(skip); // past the shared instruction
    row.appendChild(cell(prompt.slice(0, 90), "preview prompt-preview"));
    row.appendChild(cell((t.completion_preview || "—").slice(0, 90), "preview output-preview"));
    row.appendChild(cell("v" + t.policy_version, "num"));
    row.appendChild(cell(t.learned_in_step === null ? "—" : String(t.learned_in_step), "num"));
    row.appendChild(cell(t.advantage === null || t.advantage === undefined ? "—" : Number(t.advantage).toFixed(3), "num"));
    row.appendChild(cell(""));
    row.appendChild(cell(""));
    row.appendChild(cell(""));
    return row;
  }

  function loadTrajectories() {
    var body = document.getElementById("live-trajectories");
    if (!body || !config.trajectories || config.filtered) return Promise.resolve();
    var url = config.trajectories + "?run=" + config.run + "&after=" + lastTrajectoryId + "&limit=50";
    return getJSON(url).then(function (page) {
      var rows = page.results.slice().sort(function (a, b) { return a.id - b.id; });
      rows.forEach(function (t) {
        if (t.id <= lastTrajectoryId) return;
        lastTrajectoryId = t.id;
        var host = body.closest("table");
        body.insertBefore(trajectoryRow(t, Boolean(host && host.dataset.bulk)), body.firstChild);
      });
      var count = document.getElementById("new-trajectories");
      if (count && rows.length) count.textContent = String(Number(count.textContent || "0") + rows.length);
      var table = body.closest("table");
      if (table && rows.length) table.hidden = false;
    });
  }

  // --- the websocket ------------------------------------------------------------------------

  var HANDLERS = {
    metrics: function (p) {
      setStep(p.step);
      sectionsSoon();
      Object.keys(p.values).forEach(function (name) { appendPoint(name, p.step, p.values[name]); });
    },
    event: function (p) {
      addEvent({ id: p.id, kind: p.kind, level: p.level, message: p.message, data: p.data, created_at: p.created_at });
    },
    status: function (p) { setStatus(p.status); loadDetail().catch(function () {}); },
    policy: function (p) {
      var node = document.getElementById("policy-version");
      if (node) node.textContent = String(p.version);
    },
    rollout: function () { loadTrajectories().catch(function () {}); },
  };

  function refetchAll() {
    return Promise.all([
      loadMetrics().catch(function () {}),
      loadEvents().catch(function () {}),
      loadDetail().catch(function () {}),
      loadTrajectories().catch(function () {}),
    ]);
  }

  // Without the websocket (Redis down, a proxy that drops it) the page polls the same REST
  // endpoints it re-fetches on connect, and keeps trying to reconnect: it never goes stale.
  var POLL_MS = 5000;
  var pollTimer = null;
  function pollWhileOffline() {
    if (pollTimer) return;
    pollTimer = window.setInterval(function () { refetchAll(); }, POLL_MS);
  }
  function stopPolling() {
    if (pollTimer) window.clearInterval(pollTimer);
    pollTimer = null;
  }

  var retries = 0;
  var everOpened = false;
  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket;
    try {
      socket = new WebSocket(scheme + window.location.host + config.ws);
    } catch (error) {
      setLive("off", "live updates off · refreshing every 5 s");
      refetchAll();
      pollWhileOffline();
      return;
    }
    socket.onopen = function () {
      everOpened = true;
      retries = 0;
      stopPolling();
      setLive("on", "live");
      refetchAll(); // whatever was sent while away is in the record
    };
    socket.onmessage = function (message) {
      var data;
      try { data = JSON.parse(message.data); } catch (error) { return; }
      var handler = HANDLERS[data.event];
      if (handler) handler(data.payload || {});
    };
    socket.onclose = function (event) {
      // 4401 and 4404: not signed in or not a member; retrying will not help.
      if (event.code === 4401 || event.code === 4404) {
        setLive("off", "live updates off");
        return;
      }
      setLive("polling", "live updates off · refreshing every 5 s");
      if (!everOpened && !pollTimer) refetchAll(); // nothing was loaded yet: load it now
      pollWhileOffline();
      retries += 1;
      window.setTimeout(connect, Math.min(8000, 500 * Math.pow(2, retries)));
    };
  }

  if (charts) charts.onChange(function () { CHARTS.concat([OTHER]).forEach(function (chart) { scheduleDraw(chart); }); });

  window.flywheelLive = { series: function () { return series; }, refetch: refetchAll };

  document.addEventListener("DOMContentLoaded", function () {
    tickTimes();
    window.setInterval(tickTimes, 5000);
    // The metrics are fetched once on load: by the socket's open (which re-fetches everything),
    // or at once when there is no socket to wait for.
    if ("WebSocket" in window) connect();
    else {
      refetchAll();
      setLive("polling", "live updates off · refreshing every 5 s");
      pollWhileOffline();
    }
  });
})();
