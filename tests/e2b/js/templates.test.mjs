// E2B template builds with the JS SDK's own builder (`Template().fromTemplate()...`,
// `Template.build`): its steps (ENV, COPY with a mode, RUN as the build's user and as root)
// and start command with a ready check become SPACE's build steps and start command; the
// files go up by the SDK's hash to the signed URL SPACE hands out; build logs come back by
// `logsOffset`. A second build takes every step from the cache and uploads nothing; a
// failing step is the SDK's BuildError.

import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import * as e2b from '#e2b'
import { env, killTracked, track, unique } from './helpers.mjs'

const { Template, Sandbox } = e2b
const skip = typeof Template !== 'function' ? 'this SDK release has no template builds' : false


// `Template.build(t, name, opts)`; releases before the name argument (2.9) take
// `Template.build(t, { alias, ...opts })`.
function build(t, name, opts = {}) {
  return Template.build.length >= 3 ? Template.build(t, name, opts) : Template.build(t, { alias: name, ...opts })
}

function context() {
  const dir = mkdtempSync(join(tmpdir(), 'e2b-template-'))
  mkdirSync(join(dir, 'app', 'lib'), { recursive: true })
  writeFileSync(join(dir, 'app', 'hello.txt'), 'hello from the context\n')
  writeFileSync(join(dir, 'app', 'lib', 'x.py'), 'print(1)\n')
  writeFileSync(join(dir, 'notes.txt'), 'notes\n')
  return dir
}

function definition(dir) {
  return Template({ fileContextPath: dir })
    .fromTemplate(env.template)
    .setEnvs({ APP_MODE: 'e2b' })
    .copy('app', '/home/user/app')
    .copy('notes.txt', '/home/user/notes.txt', { mode: 0o600 })
    .runCmd('echo "$APP_MODE $(id -un) $(pwd)" > /home/user/built.txt')
    .runCmd('touch /made-by-root', { user: 'root' })
    .setStartCmd(
      'echo started > /tmp/started; sleep 1; touch /tmp/ready; while :; do sleep 1; done',
      e2b.waitForFile('/tmp/ready'),
    )
}

describe('template builds', { skip }, () => {
  after(killTracked)

  test('steps, files and a start command make a template sandboxes start from', async () => {
    const dir = context()
    const name = unique('e2b-tpl')
    const logs = []
    const onBuildLogs = (entry) => logs.push(String(entry.message ?? entry))
    await build(definition(dir), name, { onBuildLogs })
    const all = logs.join('\n')
    assert.match(all, /start command ready after/, all)
    assert.match(all, /template .* ready/, all)

    const sbx = track(await Sandbox.create(name))
    const out = await sbx.commands.run(
      'cat /home/user/app/hello.txt /home/user/app/lib/x.py /home/user/built.txt; ' +
        'stat -c "%a %U" /home/user/notes.txt; ls /made-by-root; ' +
        'test -f /tmp/ready && cat /tmp/started; id -un',
    )
    assert.equal(
      out.stdout,
      'hello from the context\nprint(1)\ne2b user /home/user\n600 user\n/made-by-root\nstarted\nuser\n',
    )

    // The same template again: its files are not uploaded again, its steps not run again.
    const again = []
    await build(definition(dir), name, { onBuildLogs: (e) => again.push(String(e.message ?? e)) })
    const second = again.join('\n')
    assert.match(second, /Skipping upload of 'app', already cached/, second)
    assert.doesNotMatch(second, /starting a builder sandbox/, second)

    if (typeof Template.exists === 'function') {
      assert.equal(await Template.exists(name), true)
      assert.equal(await Template.exists(unique('e2b-none')), false)
    }
  })

  test('a failing step fails the build with its output', async () => {
    const t = Template().fromTemplate(env.template).runCmd('echo about to fail; exit 3')
    await assert.rejects(build(t, unique('e2b-bad')), (e) => {
      assert.ok(e instanceof e2b.BuildError, `${e}`)
      assert.match(e.message, /exited with code 3/)
      return true
    })
  })
})
