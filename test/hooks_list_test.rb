# frozen_string_literal: true

require "test_helper"

# Evt::HOOKS is the one list of the hooks evt answers: it must say what the schedulers really do.
class HooksListTest < Minitest::Test
  def test_every_listed_hook_is_answered_by_the_scheduler
    missing = Evt::HOOKS.keys - Evt::Scheduler.public_instance_methods
    missing -= Evt::RUBY_LOOP_LEAVES unless Evt.extension? # Evt::Scheduler is the pure-Ruby loop then
    assert_empty missing, "listed in Evt::HOOKS, not answered by Evt::Scheduler"
  end

  def test_the_pure_ruby_loop_answers_every_hook_but_those_it_leaves_to_ruby
    methods = Evt::SelectScheduler.public_instance_methods
    assert_empty Evt::HOOKS.keys - Evt::RUBY_LOOP_LEAVES - methods, "listed, not answered by the pure-Ruby loop"
    assert_empty Evt::RUBY_LOOP_LEAVES & methods, "the pure-Ruby loop answers a hook it is listed as leaving to Ruby"
  end

  def test_each_entry_names_its_call_where_it_lives_and_its_rubies
    Evt::HOOKS.each do |name, hook|
      assert hook.call.start_with?(name.to_s), "#{name}: the call must start with the hook's name"
      refute_empty hook.where.to_s, name.to_s
      assert_match(/\A\d\.\d\+\z/, hook.rubies, name.to_s)
    end
  end

  # The hooks this Ruby calls that exist in Fiber::Scheduler's documented interface: evt answers each.
  def test_no_hook_this_ruby_calls_is_missing_from_the_list
    this_ruby = %i[io_wait io_read io_write io_pread io_pwrite io_select kernel_sleep block unblock
                   timeout_after process_wait address_resolve fiber close]
    this_ruby << :blocking_operation_wait if RUBY_VERSION >= "3.4"
    this_ruby.push(:io_close, :fiber_interrupt, :yield) if RUBY_VERSION >= "4"
    assert_empty this_ruby - Evt::HOOKS.keys
  end
end
