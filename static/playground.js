// The playground: the prompt goes to every chosen model at once through /v1/ (streamed), and each
// answer is written into its own pane. Model output is untrusted text: it only ever goes through
// textContent, never into HTML.
(function () {
  "use strict";
  const form = document.getElementById("playground");
  const panes = document.getElementById("playground-panes");
  const template = document.getElementById("playground-pane");
  if (!form || !panes || !template) return;

  function body(model) {
    const data = new FormData(form);
    const prompt = data.get("prompt");
    const chat = data.get("mode") === "chat";
    const request = { model: model, stream: true, stream_options: { include_usage: true } };
    if (chat) request.messages = [{ role: "user", content: prompt }];
    else request.prompt = prompt;
    const maxTokens = data.get("max_tokens");
    const temperature = data.get("temperature");
    if (maxTokens) request.max_tokens = Number(maxTokens);
    if (temperature !== null && temperature !== "") request.temperature = Number(temperature);
    return { chat: chat, request: request };
  }

  function paneFor(input) {
    const pane = template.content.firstElementChild.cloneNode(true);
    pane.dataset.model = input.value;
    pane.querySelector(".pane-name").textContent = input.dataset.name;
    pane.querySelector(".pane-id").textContent = input.value;
    panes.appendChild(pane);
    return pane;
  }

  function fail(pane, message) {
    pane.classList.add("pane-error");
    pane.querySelector(".pane-status").textContent = message;
  }

  // Server-sent events from a fetch body: "data: {...}" blocks, "data: [DONE]" last.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    }
  }

  async function ask(pane, model, csrf) {
    const { chat, request } = body(model);
    const url = chat ? form.dataset.urlChat : form.dataset.urlCompletion;
    const output = pane.querySelector(".pane-output");
    const status = pane.querySelector(".pane-status");
    const started = performance.now();
    let response;
    try {
      response = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify(request),
      });
    } catch (error) {
      fail(pane, `request failed: ${error}`);
      return;
    }
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      try {
        message = (await response.json()).error.message;
      } catch (error) { /* not JSON: keep the status */ }
      fail(pane, message);
      return;
    }
    status.textContent = "generating…";
    let finish = null;
    let tokens = null;
    let firstAt = null;
    for await (const event of events(response)) {
      if (event.error) {
        fail(pane, event.error.message);
        return;
      }
      if (event.usage) tokens = event.usage.completion_tokens;
      for (const choice of event.choices || []) {
        const text = chat ? (choice.delta && choice.delta.content) || "" : choice.text || "";
        if (text) {
          if (firstAt === null) firstAt = performance.now();
          output.textContent += text;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    const seconds = (performance.now() - started) / 1000;
    const parts = [`finished: ${finish}`];
    if (tokens !== null) parts.push(`${tokens} tokens`, `${(tokens / seconds).toFixed(1)} tokens/s`);
    parts.push(`${Math.round(seconds * 1000)} ms`);
    if (firstAt !== null) parts.push(`first text after ${Math.round(firstAt - started)} ms`);
    status.textContent = parts.join(" · ");
    pane.dataset.finished = finish || "";
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
    const chosen = Array.from(form.querySelectorAll("input[name=model]:checked"));
    panes.replaceChildren();
    if (!chosen.length) {
      const note = document.createElement("p");
      note.className = "empty";
      note.textContent = "Choose at least one tier or checkpoint.";
      panes.appendChild(note);
      return;
    }
    for (const input of chosen) ask(paneFor(input), input.value, csrf);
  });
})();
