// Reviewing: keyboard shortcuts on a trajectory (1-4 label and save, n next, c comment), and
// bulk labelling of the trajectories ticked in the browser. Everything works without it.
(function () {
  "use strict";

  function typing(target) {
    return Boolean(target && target.closest && target.closest("textarea, select, [contenteditable], input:not([type=radio]):not([type=checkbox])"));
  }

  function setupShortcuts() {
    var form = document.getElementById("review-form");
    var next = document.getElementById("next-trajectory");
    if (!form && !next) return;
    document.addEventListener("keydown", function (event) {
      if (event.ctrlKey || event.metaKey || event.altKey) return;
      if (typing(event.target)) {
        if (event.key === "Escape") event.target.blur();
        return;
      }
      var index = "1234".indexOf(event.key);
      if (form && index !== -1 && event.key.length === 1) {
        var radios = form.querySelectorAll("input[name=label]");
        if (!radios[index]) return;
        event.preventDefault();
        radios[index].checked = true;
        form.dataset.submitting = radios[index].value;
        if (form.requestSubmit) form.requestSubmit(); else form.submit();
      } else if (event.key === "n" && next) {
        event.preventDefault();
        next.click();
      } else if (event.key === "c" && form) {
        var comment = form.querySelector("textarea[name=comment]");
        if (comment) { event.preventDefault(); comment.focus(); }
      }
    });
  }

  function setupBulk() {
    var form = document.getElementById("bulk-form");
    if (!form) return;
    var all = document.getElementById("select-all");
    var count = document.getElementById("bulk-count");
    var submit = document.getElementById("bulk-submit");
    function boxes() { return form.querySelectorAll("input[name=trajectory]"); }
    function update() {
      var ticked = form.querySelectorAll("input[name=trajectory]:checked").length;
      if (count) count.textContent = ticked ? ticked + " selected" : "none selected";
      if (submit) {
        submit.disabled = ticked === 0;
        submit.textContent = ticked ? "Label " + ticked + " selected" : "Label selected";
      }
      if (all) {
        var total = boxes().length;
        all.checked = total > 0 && ticked === total;
        all.indeterminate = ticked > 0 && ticked < total;
      }
      boxes().forEach(function (box) {
        var row = box.closest("tr");
        if (row) row.classList.toggle("selected", box.checked);
      });
    }
    form.addEventListener("change", function (event) {
      if (event.target === all) boxes().forEach(function (box) { box.checked = all.checked; });
      update();
    });
    update();
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupShortcuts();
    setupBulk();
  });
})();
