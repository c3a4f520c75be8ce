// Upload page: photos dropped anywhere on the dashed box go into the file field (the field alone works without this).
(function () {
  var box = document.querySelector(".drop"), input = document.getElementById("upload-input");
  if (!box || !input) return;
  ["dragenter", "dragover"].forEach(function (t) { box.addEventListener(t, function (e) { e.preventDefault(); box.classList.add("over"); }); });
  box.addEventListener("dragleave", function () { box.classList.remove("over"); });
  box.addEventListener("drop", function (e) {
    e.preventDefault(); box.classList.remove("over");
    if (e.dataTransfer && e.dataTransfer.files.length) { input.files = e.dataTransfer.files; }
  });
})();
