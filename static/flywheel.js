// Flywheel's one script: copy buttons, live updates on the project page, the launch form's rows.
// Everything works without it; when the websocket cannot connect there are just no live updates.
(function () {
  "use strict";

  function selectText(node) {
    var range = document.createRange();
    range.selectNodeContents(node);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function setupCopyButtons() {
    document.querySelectorAll("[data-copy]").forEach(function (button) {
      button.addEventListener("click", function () {
        var target = document.querySelector(button.getAttribute("data-copy"));
        if (!target) return;
        selectText(target);
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(target.textContent).then(
            function () { button.textContent = "Copied"; },
            function () { button.textContent = "Press Ctrl+C"; }
          );
        } else {
          button.textContent = "Press Ctrl+C";
        }
      });
    });
  }

  var EVENT_TEXT = {
    "task_set.version_created": "New version imported",
    "member.added": "A member was added",
  };

  function setupLiveSection() {
    var section = document.querySelector("[data-live-section][data-ws-path]");
    if (!section || !("WebSocket" in window)) return;
    var status = document.getElementById("live-status");
    var banner = document.getElementById("live-banner");
    var bannerText = document.getElementById("live-banner-text");
    var retries = 0;
    var everOpened = false;
    var pollTimer = null;

    function setStatus(state, text) {
      if (!status) return;
      status.dataset.state = state;
      status.textContent = text;
    }

    function showBanner(text) {
      if (!banner) return;
      bannerText.textContent = text + " — refresh to see it.";
      banner.hidden = false;
    }

    // Re-render the list from the server (already escaped HTML); fall back to the banner.
    function reloadSection(eventName) {
      fetch(window.location.href, { credentials: "same-origin" })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(section.id);
          if (!fresh) throw new Error("section missing");
          // Ticked runs stay ticked across a live re-render of the runs table.
          var ticked = Array.prototype.map.call(section.querySelectorAll("input[name=runs]:checked"), function (box) { return box.value; });
          section.innerHTML = fresh.innerHTML;
          ticked.forEach(function (id) {
            var box = section.querySelector('input[name=runs][value="' + id + '"]');
            if (box) box.checked = true;
          });
          section.querySelectorAll("#compare-form").forEach(updateCompare);
        })
        .catch(function () {
          showBanner(EVENT_TEXT[eventName] || "Something changed in this project");
        });
    }

    function connect() {
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      var socket;
      try {
        socket = new WebSocket(scheme + window.location.host + section.dataset.wsPath);
      } catch (error) {
        setStatus("off", "live updates off");
        return;
      }
      socket.onopen = function () {
        if (everOpened) reloadSection(null); // events sent while away are lost: re-fetch
        everOpened = true;
        retries = 0;
        if (pollTimer) window.clearInterval(pollTimer);
        pollTimer = null;
        setStatus("on", "live");
      };
      socket.onmessage = function (message) {
        var data;
        try {
          data = JSON.parse(message.data);
        } catch (error) {
          return;
        }
        reloadSection(data.event);
      };
      socket.onclose = function (event) {
        // 4401 and 4404: not signed in or not a member; retrying will not help.
        if (event.code === 4401 || event.code === 4404) {
          setStatus("off", "live updates off");
          return;
        }
        // Without the websocket (Redis down), re-render from the server every 15 s, and keep
        // trying to reconnect.
        setStatus("polling", "live updates off · refreshing every 15 s");
        if (!pollTimer) pollTimer = window.setInterval(function () { reloadSection(null); }, 15000);
        retries += 1;
        window.setTimeout(connect, Math.min(30000, 1000 * Math.pow(2, Math.min(retries, 5))));
      };
    }

    connect();
  }

  // The launch form: dim the hyperparameters the chosen method does not have (still editable,
  // so a value typed there is refused with its reason rather than silently dropped).
  function setupMethodRows() {
    var method = document.querySelector("#run-form select[name=method]");
    if (!method) return;
    function update() {
      document.querySelectorAll("#hyperparameters tr[data-methods]").forEach(function (row) {
        var methods = row.dataset.methods.split(" ");
        row.classList.toggle("not-for-method", methods.indexOf(method.value) === -1);
      });
    }
    method.addEventListener("change", update);
    update();
  }

  // The runs table: the compare button says how many runs are ticked (delegated, so a table
  // re-rendered by a live update keeps working).
  function updateCompare(form) {
    var ticked = form.querySelectorAll("input[name=runs]:checked").length;
    var button = form.querySelector("#compare-selected");
    var count = form.querySelector("#compare-count");
    if (button) {
      button.disabled = ticked < 2;
      button.textContent = ticked < 2 ? "Compare selected" : "Compare " + ticked + " runs";
    }
    if (count) count.textContent = ticked === 0 ? "Tick runs to compare them." : ticked === 1 ? "Tick one more." : ticked + " ticked.";
    form.querySelectorAll("tr[data-run]").forEach(function (row) {
      var box = row.querySelector("input[name=runs]");
      row.classList.toggle("selected", Boolean(box && box.checked));
    });
  }

  function setupRunsTable() {
    document.querySelectorAll("#compare-form").forEach(updateCompare);
    document.addEventListener("change", function (event) {
      var form = event.target.closest && event.target.closest("#compare-form");
      if (form && event.target.name === "runs") updateCompare(form);
    });
  }

  // Phones (below 860 px): the navigation folds behind the Menu button (static/flywheel.css).
  function setupMenu() {
    var button = document.querySelector(".menu-toggle");
    var bar = button && button.closest(".topbar");
    if (!bar) return;
    function show(open) {
      button.setAttribute("aria-expanded", open ? "true" : "false");
      bar.classList.toggle("menu-open", open);
    }
    button.addEventListener("click", function () {
      show(button.getAttribute("aria-expanded") !== "true");
    });
    document.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && bar.classList.contains("menu-open")) {
        show(false);
        button.focus();
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupMenu();
    setupRunsTable();
    setupCopyButtons();
    setupLiveSection();
    setupMethodRows();
  });
})();
