// The launch form's estimate: what the run would use (POST /api/v1/runs/estimate, which launches
// nothing), asked again whenever a field changes. The answer rests on earlier runs of the same
// tier and method; with none, the server says why and so does this panel, and "Calibrate" asks the
// same endpoint to launch a short calibration run ("calibrate": true); while it runs, the panel
// asks again every few seconds until its steps are the basis.
(() => {
  "use strict";
  const form = document.getElementById("run-form");
  const out = document.getElementById("estimate-text");
  const calibrate = document.getElementById("estimate-calibrate");
  if (!form || !out) return;
  const ACTIVE = ["queued", "starting", "running", "pausing", "paused"];
  const POLL_MS = 5000;
  let poll = null;
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  let timer = null;
  let asked = 0;

  // A hyperparameter as typed: "auto" or nothing is left to the default; numbers and booleans
  // are sent as such (the API checks each against its type).
  function typed(text) {
    const value = text.trim();
    if (value === "" || value === "auto") return undefined;
    if (/^-?\d+$/.test(value)) return Number(value);
    if (/^-?(\d+\.?\d*|\.\d+)(e-?\d+)?$/i.test(value)) return Number(value);
    if (value === "true" || value === "false") return value === "true";
    return value;
  }

  function request() {
    const data = new FormData(form);
    const hyperparameters = {};
    for (const [name, raw] of data) {
      if (!name.startsWith("hp_")) continue;
      const value = typed(String(raw));
      if (value !== undefined) hyperparameters[name.slice(3)] = value;
    }
    const id = (name) => Number(data.get(name)) || undefined;
    return {
      project: Number(form.dataset.project),
      task_set_version: id("task_set_version"),
      reward_rule_version: id("reward_rule_version"),
      tier: id("tier"),
      method: data.get("method") || "grpo",
      max_steps: id("max_steps") || 20,
      hyperparameters,
    };
  }

  const figure = (value) => (value >= 10 ? value.toFixed(0) : value >= 1 ? value.toFixed(1) : value.toPrecision(2));
  const duration = (seconds) =>
    seconds >= 5400 ? `${figure(seconds / 3600)} h` : seconds >= 90 ? `${figure(seconds / 60)} min` : `${figure(seconds)} s`;

  function describe(answer) {
    if (!answer.basis) return answer.why;
    const device = answer.device_hours;
    const parts = [
      `${figure(device.expected)} device-hours (${figure(device.low)}–${figure(device.high)})`,
    ];
    if (answer.wall_seconds) {
      const wall = answer.wall_seconds;
      parts.push(`about ${duration(wall.expected)} (${duration(wall.low)}–${duration(wall.high)})`);
    }
    const money = answer.money;
    if (Number(money.high) > 0) {
      parts.push(`${Number(money.expected).toFixed(2)} at today's prices (${Number(money.low).toFixed(2)}–${Number(money.high).toFixed(2)})`);
    }
    return `${parts.join(", ")}: ${answer.why}.`;
  }

  const calibrating = (answer) =>
    !answer.basis && answer.calibration && ACTIVE.includes(answer.calibration.status);

  async function refresh(extra = {}) {
    const mine = ++asked;
    clearTimeout(poll);
    const body = request();
    if (!body.task_set_version || !body.reward_rule_version || !body.tier) {
      out.textContent = "Choose a task set version, a reward rule version and a tier to see what the run would use.";
      if (calibrate) calibrate.hidden = true;
      return;
    }
    let text;
    let answer = null;
    try {
      const response = await fetch("/api/v1/runs/estimate", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify({ ...body, ...extra }),
      });
      const data = await response.json();
      answer = response.ok ? data : null;
      text = response.ok ? describe(data) : `No estimate yet: ${data.error ? data.error.message : response.status}`;
    } catch (error) {
      text = "No estimate: the server did not answer.";
    }
    if (mine !== asked) return; // only the answer to the latest form
    out.textContent = text;
    if (calibrate) calibrate.hidden = !answer || Boolean(answer.basis) || calibrating(answer);
    if (answer && calibrating(answer)) poll = setTimeout(refresh, POLL_MS);
  }

  if (calibrate) {
    calibrate.addEventListener("click", () => {
      calibrate.hidden = true;
      refresh({ calibrate: true });
    });
  }

  form.addEventListener("change", () => {
    clearTimeout(timer);
    timer = setTimeout(refresh, 250);
  });
  refresh();
})();
