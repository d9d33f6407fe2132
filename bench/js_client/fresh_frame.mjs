// A fresh same-origin iframe on /blank in place of the last one: a new realm, so a client script loaded
// into it starts cold (no feedback, nothing optimized), as each benchmark run should.
export async function freshFrame(page) {
  await page.evaluate(() => new Promise((resolve) => {
    document.querySelector("iframe")?.remove();
    const iframe = document.createElement("iframe");
    iframe.onload = resolve;
    iframe.src = "/blank";
    document.body.appendChild(iframe);
  }));
  return (await page.$("iframe")).contentFrame();
}
