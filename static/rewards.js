// Reward rule pages: the form editor kept in sync with the JSON view, validated as you type
// through POST /api/v1/reward-rules/validate; and the dry-run form's item source switch.
// Plain DOM: every text goes in through textContent or .value, never as HTML. Without this
// script the JSON textarea still submits and the server validates it.
(function () {
  "use strict";

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else if (name === "value") node.value = attrs[name];
      else node.setAttribute(name, attrs[name]);
    });
    (children || []).forEach(function (child) {
      if (child) node.appendChild(child);
    });
    return node;
  }

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  function pretty(value) {
    return JSON.stringify(value, null, 2);
  }

  var nextId = 0;
  function uid(prefix) {
    nextId += 1;
    return prefix + "-" + nextId;
  }

  function setupRuleEditor() {
    var form = document.getElementById("rule-form");
    var editor = document.getElementById("spec-editor");
    var typesNode = document.getElementById("grader-types");
    if (!form || !editor || !typesNode || !form.dataset.validateUrl) return;
    var textarea = form.querySelector("textarea[name=spec]");
    var status = document.getElementById("spec-status");
    var problemList = document.getElementById("spec-problems");
    var csrf = form.querySelector("input[name=csrfmiddlewaretoken]");
    var types = JSON.parse(typesNode.textContent);
    var byType = {};
    types.forEach(function (kind) { byType[kind.type] = kind; });
    var spec = null;
    var timer = null;
    var sequence = 0;

    document.getElementById("form-editor-fallback").hidden = true;
    editor.hidden = false;

    // --- form -> JSON -------------------------------------------------------------------------

    function changed(structural) {
      textarea.value = pretty(spec);
      if (structural) render();
      scheduleValidate();
    }

    function typeSelect(current, onPick) {
      var select = el("select", {});
      if (!byType[current]) select.appendChild(el("option", { value: current || "", text: current || "(choose a type)" }));
      types.forEach(function (kind) {
        var option = el("option", { value: kind.type, text: kind.label + " (" + kind.type + ")" });
        if (kind.type === current) option.selected = true;
        select.appendChild(option);
      });
      select.addEventListener("change", function () { onPick(select.value); });
      return select;
    }

    function fieldInput(grader, field, id) {
      var value = grader[field.name];
      var input;
      if (field.kind === "select") {
        input = el("select", { id: id });
        input.appendChild(el("option", { value: "", text: "—" }));
        if (value !== undefined && field.choices.indexOf(value) === -1) {
          input.appendChild(el("option", { value: String(value), text: String(value) + " (not allowed)", selected: "selected" }));
        }
        field.choices.forEach(function (choice) {
          var option = el("option", { value: String(choice), text: String(choice) });
          if (choice === value) option.selected = true;
          input.appendChild(option);
        });
      } else if (field.kind === "json") {
        input = el("textarea", { id: id, rows: "3", spellcheck: "false", class: "code-input" });
        input.value = value === undefined ? "" : pretty(value);
      } else if (field.kind === "code") {
        input = el("textarea", { id: id, rows: "8", spellcheck: "false", class: "code-input" });
        input.value = value === undefined ? "" : String(value);
      } else {
        input = el("input", { id: id, type: field.kind === "number" ? "number" : "text", step: "any" });
        input.value = value === undefined || value === null ? "" : (isObject(value) || Array.isArray(value) ? pretty(value) : String(value));
      }
      // A field drawn for one type of grader fires "change" as it loses focus, which can come
      // after the grader was retyped: its old value must not be written into the new grader.
      var drawnFor = grader.type;
      function read() { if (grader.type === drawnFor) readField(grader, field, input); }
      input.addEventListener("input", read);
      input.addEventListener("change", read);
      return input;
    }

    function readField(grader, field, input) {
      var raw = input.value;
      input.classList.remove("input-invalid");
      if (raw === "") {
        delete grader[field.name];
      } else if (field.kind === "number") {
        var number = Number(raw);
        if (isNaN(number)) { input.classList.add("input-invalid"); return; }
        grader[field.name] = number;
      } else if (field.kind === "json") {
        try {
          grader[field.name] = JSON.parse(raw);
        } catch (error) {
          input.classList.add("input-invalid");
          return;
        }
      } else if (field.kind === "select") {
        var choice = field.choices.filter(function (c) { return String(c) === raw; })[0];
        grader[field.name] = choice === undefined ? raw : choice;
      } else {
        grader[field.name] = raw;
      }
      changed(false);
    }

    function row(label, input, path, help) {
      var wrap = el("div", { class: "field", "data-path": path });
      var labelNode = el("label", { for: input.id, text: label });
      wrap.appendChild(labelNode);
      wrap.appendChild(input);
      if (help) wrap.appendChild(el("small", { class: "help", text: help }));
      return wrap;
    }

    function retype(grader, newType) {
      var kept = { type: newType };
      if (grader.name !== undefined) kept.name = grader.name;
      var kind = byType[newType];
      (kind ? kind.fields : []).forEach(function (field) {
        if (grader[field.name] !== undefined) kept[field.name] = grader[field.name];
      });
      if (newType === "multi") kept.graders = isObject(grader.graders) ? grader.graders : {};
      // A multi is a different grader from the one it replaces: it does not inherit its name
      // (nor a single grader the multi's).
      if (newType === "multi" && grader.type !== "multi") kept.name = "combined";
      else if (grader.type === "multi" && newType !== "multi") kept.name = newType;
      Object.keys(grader).forEach(function (key) { delete grader[key]; });
      Object.keys(kept).forEach(function (key) { grader[key] = kept[key]; });
    }

    // One grader: its type, name, fields; a multi also its sub-graders. `prefix` is its dotted
    // place in the rule ("" for the top, "graders.tests." for a sub-grader), as problems name it.
    function graderBlock(grader, prefix, header) {
      var block = el("div", { class: "grader-block", "data-path": prefix.replace(/\.$/, "") });
      var head = el("div", { class: "grader-head" });
      if (header) head.appendChild(header);
      var typeId = uid("grader-type");
      var select = typeSelect(grader.type, function (value) { retype(grader, value); changed(true); });
      select.id = typeId;
      head.appendChild(row("Type", select, prefix + "type"));
      var nameInput = fieldInput(grader, { name: "name", kind: "text" }, uid("grader-name"));
      head.appendChild(row("Name", nameInput, prefix + "name"));
      block.appendChild(head);
      var kind = byType[grader.type];
      if (!kind) {
        block.appendChild(el("p", { class: "muted small", text: "Unknown grader type: edit it in the JSON view." }));
        return block;
      }
      if (kind.summary) block.appendChild(el("p", { class: "muted small", text: kind.summary }));
      var known = { type: true, name: true, graders: true };
      kind.fields.forEach(function (field) {
        known[field.name] = true;
        var input = fieldInput(grader, field, uid("grader-field"));
        var label = field.label + (field.required ? "" : " (optional)");
        block.appendChild(row(label, input, prefix + field.name, field.help));
      });
      var others = Object.keys(grader).filter(function (key) { return !known[key]; });
      if (others.length) {
        block.appendChild(el("p", { class: "muted small", text: "Also set in the JSON view: " + others.join(", ") }));
      }
      if (grader.type === "multi") block.appendChild(subGraders(grader, prefix));
      return block;
    }

    function subGraders(multi, prefix) {
      if (!isObject(multi.graders)) multi.graders = {};
      var wrap = el("div", { class: "sub-graders", "data-path": prefix + "graders" });
      wrap.appendChild(el("h3", { text: "Sub-graders" }));
      var names = Object.keys(multi.graders);
      if (!names.length) wrap.appendChild(el("p", { class: "muted small", text: "None yet: add one below." }));
      names.forEach(function (key) {
        var keyInput = el("input", { type: "text", value: key, class: "grader-key", "aria-label": "Sub-grader name (used in the formula)" });
        keyInput.addEventListener("change", function () {
          var fresh = keyInput.value.trim();
          if (!fresh || fresh === key || multi.graders[fresh] !== undefined) { keyInput.value = key; return; }
          var renamed = {};
          Object.keys(multi.graders).forEach(function (k) { renamed[k === key ? fresh : k] = multi.graders[k]; });
          multi.graders = renamed;
          changed(true);
        });
        var remove = el("button", { type: "button", class: "btn btn-ghost btn-small btn-danger", text: "Remove" });
        remove.addEventListener("click", function () { delete multi.graders[key]; changed(true); });
        var header = el("div", { class: "sub-grader-key" }, [el("span", { class: "muted small", text: "as" }), keyInput, remove]);
        var sub = multi.graders[key];
        if (!isObject(sub)) {
          wrap.appendChild(el("div", { class: "grader-block", "data-path": prefix + "graders." + key }, [
            header, el("p", { class: "muted small", text: "Not a grader object: fix it in the JSON view." }),
          ]));
          return;
        }
        wrap.appendChild(graderBlock(sub, prefix + "graders." + key + ".", header));
      });
      var addType = typeSelect("", function () {});
      addType.setAttribute("aria-label", "Type of the new sub-grader");
      var addKey = el("input", { type: "text", placeholder: "name, e.g. tests", "aria-label": "Name of the new sub-grader" });
      var add = el("button", { type: "button", class: "btn btn-small", text: "Add grader" });
      add.addEventListener("click", function () {
        var key = addKey.value.trim() || addType.value;
        var n = 2;
        var base = key;
        while (multi.graders[key] !== undefined) { key = base + "_" + n; n += 1; }
        multi.graders[key] = { type: addType.value, name: key };
        changed(true);
      });
      wrap.appendChild(el("div", { class: "add-grader" }, [addType, addKey, add]));
      return wrap;
    }

    function render() {
      editor.textContent = "";
      if (!isObject(spec)) {
        editor.appendChild(el("p", { class: "muted", text: "The form edits a rule that is a JSON object; fix the JSON view." }));
        return;
      }
      editor.appendChild(graderBlock(spec, "", null));
      showProblems(lastProblems);
    }

    // --- JSON -> form -------------------------------------------------------------------------

    function readJson() {
      try {
        spec = JSON.parse(textarea.value);
      } catch (error) {
        setStatus("invalid", "JSON: " + error.message);
        return false;
      }
      render();
      return true;
    }

    textarea.addEventListener("input", function () {
      if (readJson()) scheduleValidate();
    });

    // --- validation ---------------------------------------------------------------------------

    var lastProblems = [];

    function setStatus(state, text) {
      status.dataset.state = state;
      status.textContent = text;
    }

    function placeFor(path, places) {
      var parts = path ? path.split(".") : [];
      while (parts.length) {
        var node = places[parts.join(".")];
        if (node) return node;
        parts.pop();
      }
      return places[""] || null;
    }

    function showProblems(problems) {
      lastProblems = problems;
      editor.querySelectorAll(".field-problem").forEach(function (node) { node.remove(); });
      editor.querySelectorAll(".has-error").forEach(function (node) { node.classList.remove("has-error"); });
      problemList.textContent = "";
      var places = {};
      editor.querySelectorAll("[data-path]").forEach(function (node) {
        if (!(node.dataset.path in places)) places[node.dataset.path] = node;
      });
      problems.forEach(function (problem) {
        problemList.appendChild(el("li", {}, [
          el("code", { text: problem.path || "(rule)" }), document.createTextNode(" " + problem.message),
        ]));
        var place = placeFor(problem.path, places);
        if (!place) return;
        place.classList.add("has-error");
        var note = el("p", { class: "field-error field-problem", text: problem.message });
        if (place.classList.contains("field")) place.appendChild(note);
        else place.insertBefore(note, place.children[1] || null);
      });
    }

    function scheduleValidate() {
      window.clearTimeout(timer);
      setStatus("checking", "Checking…");
      timer = window.setTimeout(validate, 300);
    }

    function validate() {
      sequence += 1;
      var mine = sequence;
      fetch(form.dataset.validateUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf ? csrf.value : "" },
        body: JSON.stringify({ spec: spec }),
      })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (body) {
          if (mine !== sequence) return; // a newer check is on its way
          showProblems(body.problems);
          if (body.valid) setStatus("valid", "Valid rule");
          else setStatus("invalid", body.problems.length + " problem" + (body.problems.length === 1 ? "" : "s"));
        })
        .catch(function () {
          if (mine === sequence) setStatus("unknown", "Could not check the rule now; saving will check it.");
        });
    }

    var serverProblems = document.getElementById("server-problems");
    lastProblems = serverProblems ? JSON.parse(serverProblems.textContent) : [];
    if (readJson()) validate();
  }

  function setupDryRunForm() {
    var form = document.getElementById("dry-run-form");
    if (!form) return;
    var radios = form.querySelectorAll("input[name=source]");
    function update() {
      var picked = form.querySelector("input[name=source]:checked");
      var source = picked ? picked.value : "paste";
      form.querySelectorAll("[data-source]").forEach(function (section) {
        section.hidden = section.dataset.source !== source;
      });
    }
    radios.forEach(function (radio) { radio.addEventListener("change", update); });
    update();
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupRuleEditor();
    setupDryRunForm();
  });
})();
