// Structured output and tool calls with the trained model through the
// official OpenAI Node client: response_format json_schema and json_object,
// a forced tool call by name and by "required", streamed and not, and a
// conversation that sends a tool's result back; models.retrieve of an alias.
// Prints one JSON line that tests/openai/trained_chat_test.cc checks.
//   BASE_URL=http://127.0.0.1:PORT/v1 MODEL=kjv-moe node structured_test.mjs
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'unused', maxRetries: 0 });
const model = process.env.MODEL;
const messages = [{ role: 'user', content: 'Who begat Enos? Answer as JSON.' }];
const verse = {
  type: 'object',
  properties: {
    book: { type: 'string', enum: ['Genesis', 'Exodus', 'Psalms'] },
    chapter: { type: 'integer', minimum: 1, maximum: 150 },
    words: { type: 'string', maxLength: 40 },
    names: { type: 'array', items: { type: 'string', maxLength: 12 }, maxItems: 3 },
  },
  required: ['book', 'chapter', 'words', 'names'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_verse', description: 'Look up a verse', parameters: verse } },
  {
    type: 'function',
    function: {
      name: 'count_words',
      parameters: { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } },
        required: ['n'], additionalProperties: false },
    },
  },
];
const out = {};

const schema = await client.chat.completions.create({
  model, messages, max_tokens: 200,
  response_format: { type: 'json_schema', json_schema: { name: 'verse', schema: verse, strict: true } },
});
out.schema_content = schema.choices[0].message.content;
out.schema_finish = schema.choices[0].finish_reason;

// json_object lets the model write any object, which this one never ends
// by itself; a bias on "}" (taken only where the grammar allows it) makes
// it close the object as soon as it may.
const base = process.env.BASE_URL.replace(/\/v1$/, '');
const tokenized = await (await fetch(`${base}/tokenize`, {
  method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ content: '}' }),
})).json();
const object = await client.chat.completions.create({
  model, messages, max_tokens: 200, response_format: { type: 'json_object' },
  logit_bias: { [tokenized.tokens[0]]: 100 },
});
out.object_content = object.choices[0].message.content;
out.object_finish = object.choices[0].finish_reason;

const named = await client.chat.completions.create({
  model, messages, max_tokens: 200, tools,
  tool_choice: { type: 'function', function: { name: 'get_verse' } },
});
out.named = named.choices[0].message;
out.named_finish = named.choices[0].finish_reason;

// The same streamed: tool_calls deltas accumulated as clients do.
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 200, tools, stream: true,
  tool_choice: { type: 'function', function: { name: 'get_verse' } },
  stream_options: { include_usage: true },
});
const streamed = { name: null, arguments: '', id: null, finish: null, content: '' };
for await (const chunk of stream) {
  if (chunk.usage) out.streamed_usage = chunk.usage;
  if (chunk.choices.length === 0) continue;
  const c = chunk.choices[0];
  streamed.content += c.delta.content ?? '';
  for (const call of c.delta.tool_calls ?? []) {
    streamed.id ??= call.id ?? null;
    streamed.name ??= call.function?.name ?? null;
    streamed.arguments += call.function?.arguments ?? '';
  }
  if (c.finish_reason) streamed.finish = c.finish_reason;
}
out.named_streamed = streamed;

const required = await client.chat.completions.create({
  model, messages, max_tokens: 200, tools, tool_choice: 'required', temperature: 0.9, seed: 11,
});
out.required = required.choices[0].message;
out.required_finish = required.choices[0].finish_reason;

const requiredStream = await client.chat.completions.create({
  model, messages, max_tokens: 200, tools, tool_choice: 'required', temperature: 0.9, seed: 11,
  stream: true,
});
const rs = { name: null, arguments: '', finish: null };
for await (const chunk of requiredStream) {
  const c = chunk.choices[0];
  for (const call of c?.delta.tool_calls ?? []) {
    rs.name ??= call.function?.name ?? null;
    rs.arguments += call.function?.arguments ?? '';
  }
  if (c?.finish_reason) rs.finish = c.finish_reason;
}
out.required_streamed = rs;

// The tool's result sent back: a conversation with an assistant tool call
// and a tool message is accepted and answered.
const call = named.choices[0].message.tool_calls[0];
const followUp = await client.chat.completions.create({
  model, max_tokens: 8, tools,
  messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: 'And Seth lived an hundred and five years' }],
});
out.follow_up_finish = followUp.choices[0].finish_reason;
out.follow_up_usage = followUp.usage;

// An unsupported keyword: a 400 naming the parameter.
try {
  await client.chat.completions.create({
    model, messages, max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } },
  });
  out.bad_schema = 'accepted';
} catch (e) {
  out.bad_schema = { status: e.status, param: e.param ?? e.error?.param, message: e.message };
}
console.log(JSON.stringify(out));
