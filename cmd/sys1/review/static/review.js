// Keyboard shortcuts for the review page (progressive enhancement: every action is also a
// plain button or link). A key with a matching data-shortcut element clicks it: 1–9 pick an
// option, 0 is "none of these", s skips. Keys typed into form fields, and keys held with a
// modifier, are left alone.
(function () {
  "use strict";
  var sent = false;
  document.addEventListener("submit", function () { sent = true; });
  document.addEventListener("keydown", function (e) {
    if (sent || e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey || e.isComposing) {
      return;
    }
    var t = e.target;
    if (t && t.closest && t.closest("input, textarea, select, [contenteditable]")) {
      return;
    }
    var key = e.key.length === 1 ? e.key.toLowerCase() : "";
    if (!/^[0-9a-z]$/.test(key)) {
      return;
    }
    var el = document.querySelector('[data-shortcut="' + key + '"]');
    if (!el || el.disabled || el.closest("fieldset[disabled]")) {
      return;
    }
    e.preventDefault();
    el.focus();
    el.click();
  });
})();
