// Trajectory replay: one step at a time from GET /api/v1/trajectories/{id}/steps?index=k (each
// step is its own compressed row, so step k of a huge trajectory opens without the rest).
// Everything the model wrote is untrusted: it goes into the page with textContent only.
(function () {
  "use strict";

  var configNode = document.getElementById("replay-config");
  if (!configNode) return;
  var config = JSON.parse(configNode.textContent);
  var componentsNode = document.getElementById("replay-components");
  var trajectoryComponents = componentsNode ? JSON.parse(componentsNode.textContent) : {};
  var TOKEN_LIMIT = 4000; // tokens drawn at once; the rest behind a button
  var cache = {};
  var current = 0;
  var timer = null;

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function asText(value) {
    if (value === undefined || value === null) return "";
    return typeof value === "string" ? value : JSON.stringify(value, null, 2);
  }

  function section(title, body) {
    var box = el("div", "replay-part");
    box.appendChild(el("h3", null, title));
    box.appendChild(body);
    return box;
  }

  function pre(value, className) {
    return el("pre", className, asText(value));
  }

  function fetchStep(index) {
    if (cache[index]) return Promise.resolve(cache[index]);
    return fetch(config.steps + "?index=" + index, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (page) {
        var step = page.results[0] || null;
        cache[index] = step;
        return step;
      });
  }

  // --- parts of a step ----------------------------------------------------------------------

  function toolResult(result) {
    var box = el("div", "tool-result");
    if (typeof result !== "object" || result === null) {
      box.appendChild(pre(result));
      return box;
    }
    if (result.mcp) box.appendChild(el("p", "mcp-tool muted small", "MCP server " + result.mcp.server + ", tool " + result.mcp.tool));
    if (result.error) box.appendChild(el("p", "tool-error bad", result.error));
    else if (result.is_error) box.appendChild(el("p", "tool-error bad", "the tool answered with an error"));
    var exit = result.exit_code !== undefined ? result.exit_code : result.exit;
    if (exit !== undefined) box.appendChild(el("p", "exit " + (exit === 0 ? "ok" : "bad"), "exit " + exit));
    if (result.stdout) { box.appendChild(el("h4", null, "stdout")); box.appendChild(pre(result.stdout, "stdout")); }
    if (result.stderr) { box.appendChild(el("h4", null, "stderr")); box.appendChild(pre(result.stderr, "stderr")); }
    var tests = result.tests || result.test_results;
    if (tests && tests.length) {
      var table = el("table", "table tests");
      var head = el("tr");
      ["test", "result", "message", "expected", "actual"].forEach(function (h) { head.appendChild(el("th", null, h)); });
      table.appendChild(head);
      tests.forEach(function (t) {
        var row = el("tr");
        var passed = t.passed !== undefined ? t.passed : t.status === "passed";
        row.appendChild(el("td", null, t.name || t.test || ""));
        row.appendChild(el("td", passed ? "pass" : "fail", passed ? "passed" : (t.outcome || t.status || "failed")));
        row.appendChild(el("td", null, t.message || t.error || ""));
        row.appendChild(el("td", null, t.expected === undefined || t.expected === null ? "" : String(t.expected)));
        row.appendChild(el("td", null, t.actual === undefined || t.actual === null ? "" : String(t.actual)));
        table.appendChild(row);
      });
      if (result.stop_reason) box.appendChild(el("p", "muted small", "stopped: " + result.stop_reason));
      box.appendChild(table);
    }
    return box;
  }

  // A line diff (longest common subsequence); files too large for it show before and after.
  function lineDiff(before, after) {
    var a = before.split("\n"), b = after.split("\n");
    var out = el("pre", "diff");
    function line(prefix, text, className) { out.appendChild(el("span", className, prefix + text + "\n")); }
    if (a.length * b.length > 4000000) {
      a.forEach(function (t) { line("- ", t, "del"); });
      b.forEach(function (t) { line("+ ", t, "add"); });
      return out;
    }
    var n = a.length, m = b.length, i, j;
    var table = [];
    for (i = 0; i <= n; i++) table.push(new Uint32Array(m + 1));
    for (i = n - 1; i >= 0; i--) for (j = m - 1; j >= 0; j--)
      table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    i = 0; j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[i] === b[j]) { line("  ", a[i], "same"); i++; j++; }
      else if (j < m && (i === n || table[i][j + 1] >= table[i + 1][j])) { line("+ ", b[j], "add"); j++; }
      else { line("- ", a[i], "del"); i++; }
    }
    return out;
  }

  // A stored unified diff (git's shape), its lines coloured by their first character.
  function unifiedDiff(text) {
    var out = el("pre", "diff");
    text.replace(/\n$/, "").split("\n").forEach(function (t) {
      var head = t.indexOf("+++") === 0 || t.indexOf("---") === 0 || t.indexOf("@@") === 0;
      var className = head ? "same" : t[0] === "+" ? "add" : t[0] === "-" ? "del" : "same";
      out.appendChild(el("span", className, t + "\n"));
    });
    return out;
  }

  function toolCalls(data) {
    var box = el("div", "tool-calls");
    if (data.valid === false) {
      var error = data.error || {};
      box.appendChild(el("p", "invalid bad", "invalid action (" + (error.kind || "invalid") + "): " + (error.message || "")));
    }
    (data.tool_calls || []).forEach(function (call) {
      box.appendChild(el("p", "tool-call-name", call.name));
      box.appendChild(pre(call.arguments, "tool-call-arguments"));
    });
    return box;
  }

  function workspace(record) {
    var box = el("div", "workspace");
    var files = record.files || {};
    Object.keys(files).sort().forEach(function (path) {
      box.appendChild(el("h4", null, path));
      box.appendChild(pre(files[path], "workspace-file"));
    });
    var bound = record.bound || {};
    var note = "bounded to " + bound.files + " files, " + bound.file_bytes + " bytes each, " + bound.total_bytes + " in all";
    if (record.omitted && record.omitted.length) note += "; left out: " + record.omitted.join(", ");
    box.appendChild(el("p", "muted small", note));
    return box;
  }

  function filesChanged(files) {
    var box = el("div", "files");
    var list = Array.isArray(files) ? files : Object.keys(files).map(function (path) {
      var f = files[path];
      return typeof f === "object" && f !== null ? Object.assign({ path: path }, f) : { path: path, after: f };
    });
    list.forEach(function (f) {
      box.appendChild(el("h4", null, f.path || "file"));
      if (f.diff) box.appendChild(unifiedDiff(asText(f.diff)));
      else box.appendChild(lineDiff(asText(f.before || ""), asText(f.after || "")));
    });
    return box;
  }

  // Log-probability as colour: likely tokens pale, unlikely ones red.
  function colour(logprob) {
    var p = Math.exp(Math.max(-20, Math.min(0, logprob)));
    var hue = Math.round(120 * p);
    return "hsl(" + hue + ", 70%, " + Math.round(88 - 18 * (1 - p)) + "%)";
  }

  function tokens(data) {
    var texts = data.tokens || null;
    var ids = data.token_ids || [];
    var logprobs = data.logprobs || [];
    var count = texts ? texts.length : ids.length;
    var box = el("div", "tokens");
    box.appendChild(el("p", "muted small", count + " tokens; colour by log-probability (green likely, red unlikely); hover for the value"));
    var strip = el("div", "token-strip");
    box.appendChild(strip);
    var shown = 0;
    function more() {
      var end = Math.min(count, shown + TOKEN_LIMIT);
      var fragment = document.createDocumentFragment();
      for (var i = shown; i < end; i++) {
        var span = el("span", "token", texts ? texts[i] : "#" + ids[i]);
        if (logprobs[i] !== undefined) {
          span.style.background = colour(logprobs[i]);
          span.title = "logprob " + Number(logprobs[i]).toFixed(3) + (ids[i] !== undefined ? " · id " + ids[i] : "");
        }
        fragment.appendChild(span);
      }
      strip.appendChild(fragment);
      shown = end;
      button.hidden = shown >= count;
      button.textContent = "Show " + Math.min(TOKEN_LIMIT, count - shown) + " more of " + (count - shown);
    }
    var button = el("button", "btn btn-small");
    button.type = "button";
    button.addEventListener("click", more);
    box.appendChild(button);
    more();
    return box;
  }

  function rewardPart(data, isLast) {
    var reward = data.reward;
    var components = data.components || data.reward_components || (isLast ? trajectoryComponents : null);
    if (reward === undefined && !components) return null;
    var list = el("dl", "settings");
    if (reward !== undefined) { list.appendChild(el("dt", null, "reward")); list.appendChild(el("dd", null, asText(reward))); }
    Object.keys(components || {}).forEach(function (name) {
      list.appendChild(el("dt", null, "· " + name));
      list.appendChild(el("dd", null, asText(components[name])));
    });
    return list;
  }

  function render(step) {
    var node = document.getElementById("replay-step");
    node.textContent = "";
    if (!step) { node.appendChild(el("p", "empty", "No such step.")); return; }
    var data = step.data || {};
    var head = el("p", "replay-head");
    head.appendChild(el("span", "badge", step.kind));
    head.appendChild(el("span", "muted small", " step " + step.index + " · " + step.raw_size + " bytes"));
    node.appendChild(head);
    var observation = data.observation !== undefined ? data.observation : data.prompt;
    if (observation !== undefined) node.appendChild(section(data.observation !== undefined ? "Observation" : "Prompt", pre(observation, "observation")));
    var action = data.action !== undefined ? data.action : data.completion;
    if (action === undefined) action = data.code !== undefined ? data.code : data.command;
    if (action !== undefined) node.appendChild(section(data.action !== undefined ? "Action" : "Completion", pre(action, "action")));
    if (data.tool_calls !== undefined || data.valid === false) node.appendChild(section("Tool calls", toolCalls(data)));
    var results = data.tool_results || null;
    var result = data.tool_result !== undefined ? data.tool_result : data.result;
    if (results && results.length > 1) results.forEach(function (r) { node.appendChild(section("Tool result: " + (r.tool || ""), toolResult(r))); });
    else if (result !== undefined) node.appendChild(section("Tool result", toolResult(result)));
    var files = data.files_changed || data.files;
    if (files && (files.length || Object.keys(files).length)) node.appendChild(section("Files changed", filesChanged(files)));
    if (data.final_workspace) node.appendChild(section("Final workspace", workspace(data.final_workspace)));
    if (data.finish_reason) node.appendChild(el("p", "muted small", "finish reason: " + data.finish_reason));
    if (data.token_ids || data.tokens) node.appendChild(section("Tokens", tokens(data)));
    var reward = rewardPart(data, step.index === config.count - 1);
    if (reward) node.appendChild(section("Reward", reward));
    var known = ["observation", "prompt", "action", "completion", "code", "command", "tool_result", "result", "files_changed", "files", "finish_reason", "tokens", "token_ids", "logprobs", "prompt_token_ids", "reward", "components", "reward_components", "messages", "reply", "tool_calls", "tool_results", "valid", "format_ok", "error", "final_workspace"];
    var rest = {};
    Object.keys(data).forEach(function (key) { if (known.indexOf(key) === -1) rest[key] = data[key]; });
    if (Object.keys(rest).length) node.appendChild(section("More", pre(rest)));
  }

  function show(index) {
    index = Math.max(0, Math.min(config.count - 1, index));
    current = index;
    document.getElementById("replay-timeline").value = String(index);
    document.getElementById("replay-jump").value = String(index);
    document.getElementById("replay-position").textContent = "step " + index + " of " + config.count;
    var node = document.getElementById("replay-step");
    if (!cache[index]) {
      // Saying so while a step loads: a blank panel reads as broken.
      node.setAttribute("aria-busy", "true");
      node.textContent = "";
      node.appendChild(el("p", "muted replay-loading", "Loading step " + index + "…"));
    }
    return fetchStep(index).then(function (step) {
      if (current !== index) return;
      node.removeAttribute("aria-busy");
      render(step);
      if (index + 1 < config.count) fetchStep(index + 1).catch(function () {}); // ready for Next
    }, function (error) {
      if (current !== index) return;
      node.removeAttribute("aria-busy");
      node.textContent = "";
      node.appendChild(el("p", "field-error replay-error", "Could not load step " + index + " (" + error.message + "); try again."));
    });
  }

  function stop() {
    if (timer) window.clearTimeout(timer);
    timer = null;
    document.getElementById("replay-play").textContent = "Play";
  }

  function tick() {
    if (current >= config.count - 1) { stop(); return; }
    var speed = Number(document.getElementById("replay-speed").value) || 1;
    show(current + 1).then(function () {
      if (timer) timer = window.setTimeout(tick, 1000 / speed);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!config.count || !document.getElementById("replay-step")) return;
    document.getElementById("replay-prev").addEventListener("click", function () { stop(); show(current - 1); });
    document.getElementById("replay-next").addEventListener("click", function () { stop(); show(current + 1); });
    document.getElementById("replay-go").addEventListener("click", function () {
      stop();
      show(Number(document.getElementById("replay-jump").value) || 0);
    });
    document.getElementById("replay-jump").addEventListener("keydown", function (event) {
      if (event.key === "Enter") { event.preventDefault(); stop(); show(Number(event.target.value) || 0); }
    });
    document.getElementById("replay-timeline").addEventListener("input", function (event) { stop(); show(Number(event.target.value)); });
    document.getElementById("replay-play").addEventListener("click", function () {
      if (timer) { stop(); return; }
      if (current >= config.count - 1) show(0);
      document.getElementById("replay-play").textContent = "Pause";
      var speed = Number(document.getElementById("replay-speed").value) || 1;
      timer = window.setTimeout(tick, 1000 / speed);
    });
    show(0);
  });
})();
