// Review page: number keys 1-9 pick the class on the numbered button, "s" skips. Typing in a field is left alone.
document.addEventListener("keydown", function (ev) {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  var t = ev.target;
  if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT")) return;
  var el = document.querySelector('[data-key="' + ev.key + '"]');
  if (!el) return;
  ev.preventDefault();
  el.classList.add("pressed");
  el.click();
});
