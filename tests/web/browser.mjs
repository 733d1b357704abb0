// The browser tests' page: the repository served on a random local port (scripts/serve.mjs) and
// Debian's Chromium, WebGPU through SwiftShader, driven by playwright-core, on the demo page.
import { spawn } from 'node:child_process';
import { chromium } from 'playwright-core';

/** Open the demo page, its console echoed here; `close()` ends the browser and the server. */
export async function openDemoPage() {
  const port = 8000 + Math.floor(Math.random() * 1000);
  const server = spawn('node', ['scripts/serve.mjs', '.', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
  let browser;
  const close = async () => {
    await browser?.close();
    server.kill();
  };
  try {
    await new Promise((resolve) => server.stdout.once('data', resolve));
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      args: ['--enable-unsafe-webgpu', '--no-sandbox', '--disable-background-networking', '--disable-component-update',
        '--no-first-run', '--disable-sync'],
    });
    const page = await browser.newPage();
    page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
    page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
    await page.goto(`http://127.0.0.1:${port}/www/`);
    return { page, close };
  } catch (e) {
    await close();
    throw e;
  }
}
