// One link in every page's header to the same page in the other edition of the book.
// The English book is built into <out>/html and the Chinese one into <out>/zh/html, so the counterpart
// of a page is found from the html root Sphinx records on <html data-content_root="...">.
(function () {
  "use strict";
  function counterpart() {
    var html = document.documentElement;
    var root = new URL(html.getAttribute("data-content_root") || "./", window.location.href);
    var page = window.location.href.slice(root.href.length);
    var chinese = (html.getAttribute("lang") || "").toLowerCase().indexOf("zh") === 0;
    var otherRoot = new URL(chinese ? "../../html/" : "../zh/html/", root);
    return { href: otherRoot.href + page, label: chinese ? "English" : "中文", lang: chinese ? "en" : "zh-CN" };
  }
  function addLink() {
    var target = counterpart();
    var link = document.createElement("a");
    link.className = "btn distlab-language-switch";
    link.href = target.href;
    link.hreflang = target.lang;
    link.textContent = target.label;
    link.title = target.lang === "en" ? "Read this page in English" : "阅读本页的中文版";
    var bar = document.querySelector(".article-header-buttons") || document.body;
    bar.insertBefore(link, bar.firstChild);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", addLink);
  } else {
    addLink();
  }
})();
