// The operations page: re-render its live section from the server (already escaped HTML) every
// few seconds, while the tab is visible; say when a refresh fails and keep trying.
(function () {
  "use strict";

  function setup() {
    var section = document.getElementById("ops-live");
    if (!section) return;
    var status = document.getElementById("live-status");
    var seconds = parseInt(section.dataset.opsRefresh, 10) || 2;
    var busy = false;

    function setStatus(state, text) {
      if (!status) return;
      status.dataset.state = state;
      status.textContent = text;
    }

    function refresh() {
      if (busy || document.hidden) return;
      busy = true;
      fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("ops-live");
          if (!fresh) throw new Error("section missing");
          section.innerHTML = fresh.innerHTML;
          setStatus("on", "live · every " + seconds + " s");
        })
        .catch(function (error) {
          setStatus("polling", "refresh failed (" + error.message + ") · retrying");
        })
        .then(function () { busy = false; });
    }

    setStatus("on", "live · every " + seconds + " s");
    window.setInterval(refresh, seconds * 1000);
    document.addEventListener("visibilitychange", refresh);
  }

  document.addEventListener("DOMContentLoaded", setup);
})();
